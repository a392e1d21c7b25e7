"""The parent side of a run: its state and the pool of arm processes commands go to."""
