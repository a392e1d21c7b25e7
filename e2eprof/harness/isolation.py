"""Worker isolation: each process on its own CPU cores, intra-op threads sized to them, idle threads asleep, and
Python's garbage collector kept out of timed steps.

Host-bound steps (decoding, small batches) are decided on the host, so what else the host runs moves them: on the
H200 two identical decoding processes differed by 24%, and setting OMP_NUM_THREADS=1 alone brought an A/A run from
1.045x to 0.982x. Serious harnesses isolate their workers (pyperf pins and tunes, JMH forks); so does e2eprof:

- cores: the parent keeps one core (its telemetry sampler, the pipes) and deals the rest out in equal, disjoint
  shares of at least two cores, one per worker process. With fewer (a laptop, a CI runner, many replicas) the workers
  share every core: a worker alone on one core queues behind its own CUDA and Python helper threads, and one bad core
  slows its process throughout (H200, llama-1b infer, 8 processes on one core each: one process 19% slower than the
  others, caught as REPLICAS_DISAGREE). Not in the default: README's trust section has the measurements.
- threads: torch's intra-op pool sized to the worker's share of the spare cores (torch's default is every core of
  the machine, so six workers would run 96 threads on 16 cores).
- passive: OMP_WAIT_POLICY=PASSIVE, so the OpenMP threads of a worker that just finished its block sleep instead of
  spinning on the core the next worker is timing on.
- gc: a collection before each window of timed or warm-up steps, none inside them, and everything alive after
  warm-up frozen out of later collections (gc.freeze), as pyperf and gpt-fast do.
- malloc: freed host blocks stay with the process between steps (glibc's mmap and trim thresholds raised), as the
  CUDA caching allocator keeps device blocks. By default glibc maps every block over 32 MB afresh and unmaps it on
  free, so a CPU gpt2 training step (batch 1 x 64) page-faulted ~200,000 pages back in every step: 0.37 s of kernel
  time in a ~1 s step on a 2-core VM, the same in every arm, diluting any difference and adding the host's page-fault
  jitter. The untimed checks give their blocks back afterwards (release_host_memory). CPU runs only by default: a GPU
  step's host allocations are small, and the GPU figures were measured without it.

`--isolate` picks them (default: threads, passive, gc, and malloc on a CPU; `all` adds cores; `none` is the
behaviour before them).
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

PARTS = ("cores", "threads", "passive", "gc", "malloc")
DEFAULT_PARTS = ("threads", "passive", "gc")
CPU_DEFAULT_PARTS = DEFAULT_PARTS + ("malloc",)
PARENT_CORES = 1  # kept for the parent process: telemetry sampling and the command pipes
MIN_CORES_TO_PIN = 2  # a worker pinned alone on one core queues behind its own helper threads


@dataclass(frozen=True)
class Placement:
    """Where one worker process runs: its cores (None: wherever the OS puts it), intra-op threads (None: torch's
    default), whether idle OpenMP threads sleep, whether gc stays out of timed steps."""

    cores: tuple[int, ...] | None = None
    threads: int | None = None
    passive: bool = False
    gc_off_the_clock: bool = False
    keep_host_blocks: bool = False

    def environment(self) -> dict[str, str]:
        """Variables a worker must have before it loads torch (OpenMP reads them once); a user's own setting wins."""
        wanted = {}
        if self.threads is not None:
            wanted["OMP_NUM_THREADS"] = str(self.threads)
        if self.passive:
            wanted["OMP_WAIT_POLICY"] = "PASSIVE"
        return {k: v for k, v in wanted.items() if k not in os.environ}

    def describe(self) -> str:
        cores = "shared cores" if self.cores is None else f"cores {_ranges(self.cores)}"
        threads = "default threads" if self.threads is None else f"{self.threads} thread(s)"
        return f"{cores}, {threads}" + (", idle threads asleep" if self.passive else "") + (
            ", gc off the clock" if self.gc_off_the_clock else "") + (", host blocks kept" if self.keep_host_blocks else "")


def default_parts(device: str | None) -> tuple[str, ...]:
    """The parts a run gets without --isolate: malloc only on a CPU (see the module docstring)."""
    return CPU_DEFAULT_PARTS if str(device or "").split(":")[0] == "cpu" else DEFAULT_PARTS


def parse(value: str | tuple[str, ...] | None, device: str | None = None) -> tuple[str, ...]:
    """--isolate's value: None (the device's default parts), "all", "none", or a comma list of PARTS."""
    if value is None:
        return default_parts(device)
    if value == "all" or value == ("all",):
        return PARTS
    if isinstance(value, str):
        items = tuple(part.strip() for part in value.split(",") if part.strip())
        if not items:
            raise ValueError("--isolate: give all, none or a comma list of " + ", ".join(PARTS))
    else:
        items = tuple(value)  # already parsed (a config copied for a sweep point): () is none
    if items == ("none",):
        return ()
    unknown = [part for part in items if part not in PARTS]
    if unknown:
        raise ValueError(f"--isolate: unknown part '{unknown[0] if unknown else value}'; give all, none or a comma "
                         f"list of {', '.join(PARTS)}")
    return tuple(part for part in PARTS if part in items)


def available_cores() -> tuple[int, ...]:
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux: no affinity control
        return tuple(range(os.cpu_count() or 1))


def plan(workers: int, parts: tuple[str, ...], cores: tuple[int, ...] | None = None) -> list[Placement]:
    """One Placement per worker process, in the order they start (see the module docstring)."""
    cores = available_cores() if cores is None else tuple(cores)
    spare = cores[PARENT_CORES:] if len(cores) > PARENT_CORES else cores
    share = len(spare) // workers if workers else 0
    pin = "cores" in parts and share >= MIN_CORES_TO_PIN
    placements = []
    for index in range(workers):
        mine = spare[index * share:(index + 1) * share] if pin else None
        # Fewer spare cores than workers: they share the machine (taking turns in timed steps), torch's default.
        threads = (len(mine) if mine else share or None) if "threads" in parts else None
        placements.append(Placement(cores=mine, threads=threads, passive="passive" in parts,
                                    gc_off_the_clock="gc" in parts, keep_host_blocks="malloc" in parts))
    return placements


@contextmanager
def environment(variables: dict[str, str]) -> Iterator[None]:
    """Set `variables` for processes started inside the block; the parent's own environment is restored after."""
    saved = {k: os.environ.get(k) for k in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


_HOST_CORES: tuple[int, ...] | None = None  # the cores a worker could use before its placement narrowed them


def apply_in_worker(placement: Placement) -> None:
    """In the worker process, before any work: its cores and its intra-op thread count."""
    global _HOST_CORES
    _HOST_CORES = available_cores()
    if placement.cores is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, placement.cores)
    if placement.threads is not None:
        import torch

        torch.set_num_threads(placement.threads)
    if placement.keep_host_blocks:
        keep_host_blocks()


# glibc's mallopt parameters (malloc.h). Blocks under 1 GiB come from the heap and freed ones stay there; the
# largest a mallopt int takes keeps the top of the heap from being trimmed after each free.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_ABOVE = 1 << 30
_TRIM_ABOVE = (1 << 31) - 1
_HOST_BLOCKS_KEPT = False


def _glibc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def keep_host_blocks() -> bool:
    """Freed host blocks stay with this process (the malloc part); False where the C library has no mallopt or
    refused the values (not glibc, an old glibc): the worker then runs with the C library's defaults."""
    global _HOST_BLOCKS_KEPT
    libc = _glibc()
    if libc is not None:
        _HOST_BLOCKS_KEPT = bool(libc.mallopt(_M_MMAP_THRESHOLD, ctypes.c_int(_MMAP_ABOVE))) and bool(
            libc.mallopt(_M_TRIM_THRESHOLD, ctypes.c_int(_TRIM_ABOVE)))
    return _HOST_BLOCKS_KEPT


def host_blocks_kept() -> bool:
    """Whether keep_host_blocks took effect in this process."""
    return _HOST_BLOCKS_KEPT


def release_host_memory() -> None:
    """After untimed work (a capture, the fp64 reference, a workload's end): the free host blocks kept by the malloc
    part go back to the system, so what an untimed check held is not carried into later phases' memory peaks."""
    if _HOST_BLOCKS_KEPT:
        _glibc().malloc_trim(0)


@contextmanager
def gc_off_the_clock(placement: Placement) -> Iterator[None]:
    """Around a window of timed or warm-up steps: collect first, then no collection until the window ends."""
    if not placement.gc_off_the_clock:
        yield
        return
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextmanager
def whole_host() -> Iterator[None]:
    """Around untimed host work that no timed step runs beside (the fp64 reference when the device has no room for
    it): every core the process had before its placement, and an intra-op thread per core; the placement's after.

    A worker's share is a few threads (six processes on 16 cores get two each); an fp64 reference of gpt2 training
    on such a share took most of a run's correctness phase (reports/2026-12-07-h100-run-time/).
    """
    import torch

    cores = _HOST_CORES or available_cores()
    narrowed = available_cores() if hasattr(os, "sched_setaffinity") else None
    threads = torch.get_num_threads()
    if narrowed is not None and narrowed != cores:
        os.sched_setaffinity(0, cores)
    torch.set_num_threads(len(cores))
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        if narrowed is not None and narrowed != cores:
            os.sched_setaffinity(0, narrowed)


def freeze_survivors(placement: Placement) -> None:
    """After warm-up: move everything alive (the model, its modules, the loop's state) out of the collector's sight,
    so a collection between blocks scans only what the steps themselves made."""
    if placement.gc_off_the_clock:
        gc.collect()
        gc.freeze()


def _ranges(cores: tuple[int, ...]) -> str:
    """(2, 3, 4, 7) -> '2-4,7'."""
    parts, start = [], None
    for i, core in enumerate(cores):
        if start is None:
            start = core
        if i + 1 == len(cores) or cores[i + 1] != core + 1:
            parts.append(str(start) if start == core else f"{start}-{core}")
            start = None
    return ",".join(parts)
