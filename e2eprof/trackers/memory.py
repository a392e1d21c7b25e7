"""Peak memory per phase inside a worker: device (torch.cuda allocator) and host (resident set size).

Device: torch.cuda.reset_peak_memory_stats at the start of a phase, max_memory_allocated / max_memory_reserved at
its end, and what was allocated and reserved as it began. The worker keeps these peaks the phase's own: it gives the
allocator's cache back after each untimed check (correctness captures, the fp64 reference, the profile) and drops
a workload's state (optimizer, gradients) once the workload is done, so no phase inherits another's memory. Host: Linux keeps a resettable high-water mark of the resident set (VmHWM; writing "5" to
/proc/self/clear_refs resets it to the current RSS), so each phase gets its own peak; where that is not possible the
process-lifetime peak from getrusage is reported instead and `host_rss_scope` says "process".

Also the test hook E2EPROF_TEST_MAX_TOKENS: out-of-memory is hard to provoke honestly on a CPU, so a worker raises
MemoryError for any step whose batch * seq exceeds this limit, exactly where a real allocation failure would surface.
Forms: "N" (every arm) or "arm:N,arm:N" (per arm; arms not named have no limit). Only tests set it.
"""

from __future__ import annotations

import math
import os
import resource
import sys
from contextlib import contextmanager
from typing import Iterator

import torch

MB = 1024 * 1024
TEST_LIMIT_ENV = "E2EPROF_TEST_MAX_TOKENS"


def _read_hwm_mb() -> float | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        return None
    return None


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def process_peak_rss_mb() -> float:
    """The process's peak resident set (ru_maxrss: kB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / MB if sys.platform == "darwin" else peak / 1024


class MemoryTracker:
    """Peaks per (workload, phase); a phase that runs in several commands (timed blocks) keeps the largest."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peaks: dict[tuple[str, str], dict] = {}

    @contextmanager
    def phase(self, workload: str, phase: str) -> Iterator[None]:
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        # What the phase found held when it began (the model, this workload's optimizer state, the allocator's
        # cache), so a reader can tell the phase's own need from what it inherited.
        start = {
            "start_alloc_mb": torch.cuda.memory_allocated(self.device) / MB if cuda else math.nan,
            "start_reserved_mb": torch.cuda.memory_reserved(self.device) / MB if cuda else math.nan,
        }
        per_phase = _reset_hwm() and _read_hwm_mb() is not None
        try:
            yield
        finally:
            host = _read_hwm_mb() if per_phase else process_peak_rss_mb()
            seen = {
                "peak_alloc_mb": torch.cuda.max_memory_allocated(self.device) / MB if cuda else math.nan,
                "peak_reserved_mb": torch.cuda.max_memory_reserved(self.device) / MB if cuda else math.nan,
                "host_peak_rss_mb": host if host is not None else math.nan,
            }
            old = self.peaks.get((workload, phase))
            if old is not None:  # a phase of several commands (timed blocks): the largest peak, the first start
                seen = {k: v if math.isnan(old[k]) else max(v, old[k]) for k, v in seen.items()}
                start = {k: old[k] for k in start}
            self.peaks[(workload, phase)] = seen | start | {"host_rss_scope": "phase" if per_phase else "process"}

    def rows(self) -> list[dict]:
        return [{"workload": w, "phase": p, **values} for (w, p), values in self.peaks.items()]


def hook_token_limit(arm: str) -> int | None:
    """The E2EPROF_TEST_MAX_TOKENS limit for this arm, or None (see the module docstring)."""
    value = os.environ.get(TEST_LIMIT_ENV, "").strip()
    if not value:
        return None
    if ":" not in value:
        return int(value)
    limits = dict(part.split(":", 1) for part in value.split(",") if part.strip())
    return int(limits[arm]) if arm in limits else None


def check_test_limit(arm: str, batch: int, seq: int) -> None:
    """Raise MemoryError where a real allocation would fail, when the test hook's limit is below batch * seq."""
    limit = hook_token_limit(arm)
    if limit is not None and batch * seq > limit:
        raise MemoryError(f"{TEST_LIMIT_ENV}={limit}: batch {batch} x seq {seq} = {batch * seq} tokens does not fit")


def release(device: torch.device) -> None:
    """Give cached memory back (after an untimed check, a workload's end, running out of memory), so the next phase
    or attempt starts from a clean allocator: the device's cache, and the host blocks the malloc isolation part keeps."""
    import gc

    from e2eprof.harness.isolation import release_host_memory

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    release_host_memory()
