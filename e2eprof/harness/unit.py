"""One unit of a run, a (point, workload), and what its phases need: the settings, the arm processes, the patch,
the run's state to record into, scratch space and where progress is announced."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from e2eprof.harness.arm_process import ArmProcess
from e2eprof.config import CompareConfig
from e2eprof.harness import pool
from e2eprof.harness.state import Events, RunState
from e2eprof.patch import Patch
from e2eprof.harness.protocol import Command, arm_of, is_replica

# torch.compile over Hugging Face decoding with a dynamic KV cache recompiles for new lengths before it settles: that
# measures the compiler's cache, not decoding, so the compile arm sits generate out (it joins the static-cache decode).
SITS_OUT = {("compile", "generate")}


@dataclass(frozen=True)
class Unit:
    config: CompareConfig
    workload: str
    processes: dict[str, ArmProcess]
    state: RunState
    patch: Patch
    scratch: Path
    events: Events
    candidates: dict = field(default_factory=dict)  # candidate arm -> its Patch (or StackedPatch)

    def patch_of(self, arm: str):
        """The patch a candidate arm runs (its tolerances judge its outputs); the run's patch for other arms."""
        return self.candidates.get(arm, self.patch)

    def candidate_arms(self) -> list[str]:
        """The arms that run a candidate kernel ("patched", or one per --patch), in --patch order."""
        return list(self.candidates) or ["patched"]

    def live(self) -> list[str]:
        """Every process still measuring this workload, replicas too (timing needs them all)."""
        state = self.state
        return [k for k in self.processes if arm_of(k) not in state.arm_failures
                and (arm_of(k), self.workload) not in state.out_of_memory and (arm_of(k), self.workload) not in SITS_OUT]

    def first(self) -> list[str]:
        """The live arms' first processes: correctness, counters and profiles are properties of the code an arm
        runs, checked once."""
        return [k for k in self.live() if not is_replica(k)]

    def call(self, key: str, command: Command):
        """One command to one process; a failure is recorded and the arm left out (harness.pool.call)."""
        return pool.call(self.processes, self.state, key, command)

    def phase(self, name: str, detail: str = "") -> AbstractContextManager[None]:
        """Announce a phase of this workload and record its wall time in phases.parquet."""
        return self.state.phase(self.events, self.workload, name, detail)
