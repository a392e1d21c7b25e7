"""`python -m torch.distributed.run`, unchanged, in a process that dies with the e2eprof parent that started it.

torchrun's agent stops its ranks when it gets SIGTERM; the death signal set here delivers that SIGTERM when the
parent is killed outright (a `kill -9` runs no cleanup), so no worker group outlives its run.
"""

import os
import runpy
import sys

from e2eprof.distributed import ENV_PARENT_PID, die_with_parent

if __name__ == "__main__":
    die_with_parent(int(os.environ[ENV_PARENT_PID]) if ENV_PARENT_PID in os.environ else None)
    sys.argv[0] = "torchrun"
    runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
