"""What the parent and an arm's worker process say to each other, declared without torch: the parent imports this,
never the worker's code.

The parent sends one Command at a time (ArmProcess.call); on the wire it travels as (name, arguments), the name
being the worker method that runs it (worker.ArmWorker), and the worker answers ("ok", result) or ("error", {...}).
A command's fields are checked where it is made, so a misspelt argument fails in the parent, not as a worker error.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

from e2eprof.harness.isolation import Placement

# How a replica's process is keyed in the parent: "<arm>#<replica>" (the arm's first process is keyed "<arm>").
REPLICA_MARK = "#"


@dataclass(frozen=True)
class ArmSpec:
    """One process of an arm: a name, the attention implementation, whether the patch is applied, whether
    torch.compile runs it, and which of the arm's identical processes (replicas) this is.

    An arm may run in several identical processes because each process carries its own step-time offset (how fast
    its host side feeds the GPU): averaging replicas shrinks that part of the interval as 1/sqrt(replicas), which no
    amount of timing inside one process can.
    """

    name: str
    attn_implementation: str
    apply_patch: bool
    compile: bool = False
    replica: int = 0

    @property
    def key(self) -> str:
        """The process's key in the parent: the arm's name for its first process, "<arm>#<replica>" after it."""
        return self.name if self.replica == 0 else f"{self.name}{REPLICA_MARK}{self.replica}"


def arm_of(key: str) -> str:
    """The arm a process key belongs to ("patched#1" -> "patched")."""
    return key.split(REPLICA_MARK, 1)[0]


def is_replica(key: str) -> bool:
    """Whether a process key names an arm's extra process rather than its first ("patched#1", not "patched")."""
    return key != arm_of(key)


@dataclass(frozen=True)
class WorkerSetup:
    arm: ArmSpec
    model: str
    patch_spec: str
    device: str
    precision: str
    seed: int
    batch: int
    seq: int
    new_tokens: int
    scratch_dir: str
    placement: Placement = Placement()  # its cores, threads and gc policy (e2eprof.harness.isolation)


def scratch_path(scratch_dir: str, arm: str, workload: str, kind: str) -> str:
    """Where an arm's outputs of one capture go (safetensors), in the run's scratch folder."""
    return str(Path(scratch_dir) / f"{kind}-{workload}-{arm}.safetensors")


# ---- commands: one class per worker method the parent may call ----------------------------------------------------


@dataclass(frozen=True)
class Command:
    name: ClassVar[str] = ""

    def args(self) -> dict:
        return asdict(self)

    def scope(self) -> str | None:
        """The workload the command works on (None: the whole arm): a process out of memory in one workload still
        takes commands for the others. (Not a property named `workload`: a subclass's field of that name would
        take the property as its default.)"""
        return self.args().get("workload")


@dataclass(frozen=True)
class Build(Command):
    """Load the patch, build and place the model, make the batches."""
    name: ClassVar[str] = "build"


@dataclass(frozen=True)
class Cold(Command):
    """The workload's first step in this process: compilation, autotuning and handle creation included."""
    name: ClassVar[str] = "cold"
    workload: str


@dataclass(frozen=True)
class Capture(Command):
    """Outputs on pristine weights, saved at `path`; every call of the patch checked when `verify` (with the
    unseen-shape and stress checks when `extended`)."""
    name: ClassVar[str] = "capture"
    workload: str
    path: str
    verify: bool
    extended: bool = True


@dataclass(frozen=True)
class Reference(Command):
    """The stock model's fp64 outputs on the same batch, saved at `path` (a stock arm only). host_fallback=False: when
    the device runs out, answer {"out_of_memory": True} instead of moving to the host (the parent first makes room)."""
    name: ClassVar[str] = "reference"
    workload: str
    path: str
    host_fallback: bool = True


@dataclass(frozen=True)
class TrainedLike(Command):
    """The patch's calls checked on trained-like weights and a padded batch (workloads.trained_like)."""
    name: ClassVar[str] = "trained_like"
    workload: str


@dataclass(frozen=True)
class Warmup(Command):
    """Steps until two consecutive windows' medians agree, or the step or time limit."""
    name: ClassVar[str] = "warmup"
    workload: str
    window: int
    tolerance: float
    max_steps: int
    max_seconds: float


@dataclass(frozen=True)
class Block(Command):
    """One timed block of `steps` steps."""
    name: ClassVar[str] = "block"
    workload: str
    block: int
    steps: int


@dataclass(frozen=True)
class Profile(Command):
    """torch.profiler over `warmup` + `active` steps, held until SummarizeProfile reads them."""
    name: ClassVar[str] = "profile"
    workload: str
    warmup: int
    active: int
    trace_path: str | None = None


@dataclass(frozen=True)
class SummarizeProfile(Command):
    """The tables of the profile the last Profile of `workload` recorded (untimed: arms summarize at once)."""
    name: ClassVar[str] = "summarize_profile"
    workload: str


@dataclass(frozen=True)
class Probe(Command):
    """One step of each workload at `batch`, for the largest-batch search."""
    name: ClassVar[str] = "probe"
    batch: int
    workloads: list[str]


@dataclass(frozen=True)
class EndWorkload(Command):
    """Drop the workload's state (its caches, graphs, optimizer) before the next one."""
    name: ClassVar[str] = "end_workload"
    workload: str


@dataclass(frozen=True)
class Counters(Command):
    """The patch's call counters and its implementations' counters."""
    name: ClassVar[str] = "counters"


@dataclass(frozen=True)
class JitCounts(Command):
    """Just-in-time work per (workload, phase): Triton compilations, autotuning, recompiles, graph captures."""
    name: ClassVar[str] = "jit_counts"


@dataclass(frozen=True)
class MemoryPeaks(Command):
    """Peak device and host memory per (workload, phase)."""
    name: ClassVar[str] = "memory_peaks"


@dataclass(frozen=True)
class ReleaseCachedMemory(Command):
    """Empty the allocator's cache, so an arm retried alone after running out of memory can use it."""
    name: ClassVar[str] = "release_cached_memory"
