"""The processes that run the arms: the protocol parent and workers speak, the parent's pool of arm processes and
run state, and the worker process itself (placement, commands, output relay)."""
