"""Worker processes started before the parent's checks, so that their imports overlap the parent's.

Before its first worker starts, a run's parent imports torch and transformers, reads the model's config and loads the
patch to check it against the model; each worker then imports the same libraries again and builds its model. On a
GPU host both take seconds (reports/2026-12-06-h200-after-host-cost/startup/ has the steps), none of it is timed, and
they need not wait for each other: the processes a run will need are started first, import torch, transformers and
the model's modeling code while the parent checks, and then wait for their WorkerSetup. The command line starts
them as soon as its options are read, before the parent imports torch (`for_config` needs neither torch nor pandas):
on GPU hosts the workers' imports, not the parent's checks, decide when the first step can run.

Only what every worker does anyway happens early: imports, nothing that depends on the arm (patches, the model's
weights, the device). A process is started with the run's compile-cache variables and the OpenMP wait policy, which
must be set before torch loads; its cores and thread count come with its setup (isolation.apply_in_worker), as for a
process started later. Processes the run does not use (a guess of one arm too many, a refusal) are stopped.
"""

from __future__ import annotations

import importlib
import signal

from e2eprof.config import CompareConfig
from e2eprof.harness import isolation
from e2eprof.harness.arm_plan import planned_arms, with_replicas
from e2eprof.harness.arm_process import spawn
from e2eprof.workloads.models import declared_architecture


def early_imports(model_type: str | None) -> list[str]:
    """What a worker started early imports, in order (benchmarks/spawn_time.py times the same list)."""
    modules = ["e2eprof.harness.worker",  # torch, e2eprof's worker code
               "transformers.modeling_utils"]  # what building any model imports first
    if model_type:
        modules.append(f"transformers.models.{model_type}.modeling_{model_type}")
    return modules


def _prestarted_main(conn, model_type: str | None) -> None:
    """The spawned process: import what every worker needs, then serve the setup it is given (or exit on None)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as worker_main: the parent decides how to stop
    try:
        for module in early_imports(model_type):
            importlib.import_module(module)
        importlib.import_module("e2eprof.harness.worker").note_imports_done()
    except Exception:  # noqa: BLE001 - only a head start: the worker imports again, and reports, when it builds
        pass
    try:
        setup = conn.recv()
    except (EOFError, OSError):
        return
    if setup is None:
        return
    from e2eprof.harness.worker import worker_main

    worker_main(conn, setup)


class Prestarted:
    """Up to `count` idle worker processes, started now; `take` hands one out (process, parent's pipe end)."""

    def __init__(self, count: int, parts: tuple[str, ...], model_type: str | None):
        # The wait policy is the same for every worker; threads and cores are set per worker from its setup.
        placement = isolation.Placement(passive="passive" in parts)
        self._idle = [spawn(_prestarted_main, (model_type,), f"e2eprof-worker-{index}", placement)
                      for index in range(count)]

    def take(self):
        """An idle process and its pipe, or None when all are taken."""
        return self._idle.pop(0) if self._idle else None

    def close(self) -> None:
        """Stop the processes nobody took. They hold nothing yet (no device, no files): terminated at once, so a run
        refused by its checks answers as fast as without them."""
        idle, self._idle = self._idle, []
        for process, _ in idle:
            process.terminate()
        for process, conn in idle:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
            conn.close()


def for_config(config: CompareConfig) -> Prestarted | None:
    """The first point's worker processes, started now, or None: for a data-parallel run (torchrun starts its
    workers), a batch-size search, a model that names no model_type (the checks refuse it), or a machine without a
    free core for each process beside the parent's: on a 2-core CPU the early imports mostly compete with the
    parent's for the same two cores (the head start there was about a second, within that machine's noise)."""
    if config.launch is not None or config.find_max_batch:
        return None
    model_type = declared_architecture(config.model)
    if model_type is None:
        return None
    # The stock-attention arm is counted whenever it is a reference arm: whether this patch needs it is known only
    # after the checks, and an unused process is stopped.
    count = len(with_replicas(config, planned_arms(config, attn="eager")))
    if len(isolation.available_cores()) < count + isolation.PARENT_CORES:
        return None
    return Prestarted(count, config.isolate, model_type)
