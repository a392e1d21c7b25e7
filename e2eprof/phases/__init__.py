"""The phases of one (point, workload): the correctness gate, timing, the profile and the proof the patch ran."""
