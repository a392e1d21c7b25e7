"""Data-parallel arms: each arm is a worker group of N ranks launched by torchrun instead of one process.

launch.py   the parent's handle on one worker group (same interface as arm_process.ArmProcess)
torchrun.py `python -m torch.distributed.run` that dies with the process that started it
rank.py     one rank: rank 0 talks to the parent and relays each command to the others
merge.py    one answer for the parent from every rank's answer
options.py  --nproc / --nnodes / --rdzv-endpoint, validated
ranks.py    what the parent derives from per-rank rows: slowest rank per step, spread, communication share
telemetry.py one NVML sampler per rank's GPU

The environment variables below carry what a rank needs before it can receive anything from the parent.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

ENV_ADDRESS = "E2EPROF_DIST_ADDRESS"  # host:port of the parent's Listener (rank 0 connects back to it)
ENV_AUTHKEY = "E2EPROF_DIST_AUTHKEY"  # hex; multiprocessing.connection's challenge, so no other process can attach
ENV_BACKEND = "E2EPROF_DIST_BACKEND"  # nccl or gloo
ENV_ERRORS = "E2EPROF_DIST_ERRORS"  # folder where a failing rank leaves rank<N>.json before it exits
ENV_PARENT_PID = "E2EPROF_DIST_PARENT_PID"  # the e2eprof parent, which the torchrun agent must not outlive

_PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: int | None = None) -> None:
    """Ask Linux to SIGTERM this process when its parent exits (no orphans after a `kill -9` of the parent).

    A no-op elsewhere. `expected_parent` closes the race where the parent died before the request was made.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)
