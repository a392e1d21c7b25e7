"""Timing one call at a time: CUDA events with an L2 flush before each call on a GPU, perf_counter_ns on a CPU.

Each trial is set up by the caller (fresh inputs), then the L2 cache is flushed by writing a buffer at least twice
its size, so an op never reads its inputs from a cache the previous trial warmed (a model's op reads tensors the
previous layer wrote long ago). Only the call itself lies between the two events. Raw samples are kept; statistics
are derived from them in one place (`Samples`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from e2eprof.gpu_spin import spin_cycles

COPY_BYTES = {"cuda": 1 << 30, "cpu": 64 << 20}  # roofline buffer: 1 GiB on a GPU, 64 MiB (past any CPU cache)
CPU_CACHE_BYTES = 32 << 20  # a generous last-level cache: an op moving less may run from cache, past the DRAM roofline


@dataclass(frozen=True)
class Samples:
    """Raw per-trial times in microseconds, and the statistics reported from them."""

    us: tuple[float, ...]

    @property
    def median(self) -> float:
        return float(np.median(self.us)) if self.us else float("nan")

    @property
    def p10(self) -> float:
        return float(np.percentile(self.us, 10)) if self.us else float("nan")

    @property
    def p90(self) -> float:
        return float(np.percentile(self.us, 90)) if self.us else float("nan")


CUSHION_US = 500.0  # longer than any replacement's host-side dispatch


class Timer:
    """Times a callable on one device; `trial` returns microseconds of one call."""

    def __init__(self, device: str | torch.device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.flush_bytes = 0
        # Bytes a cache may hold between an op's reads and writes: below this the copy roofline is no ceiling.
        self.cache_bytes = CPU_CACHE_BYTES
        if self.cuda:
            l2 = torch.cuda.get_device_properties(self.device).L2_cache_size
            self.flush_bytes = max(2 * l2, 8 << 20)
            self.cache_bytes = l2
            self._flush = torch.empty(self.flush_bytes, dtype=torch.uint8, device=self.device)
            self.cushion_us = CUSHION_US
            self._cushion_cycles = spin_cycles(self.device, CUSHION_US)
        self.last_host_us = 0.0  # host time the last trial spent queueing its call

    def sync(self) -> None:
        # Device-wide: work an op queued on another stream must be finished before the next trial starts.
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def trial(self, call: Callable[[], object]) -> float:
        """Microseconds of one `call()`: device time between CUDA events after an L2 flush, or host time on CPU."""
        if not self.cuda:
            t0 = time.perf_counter_ns()
            call()
            return (time.perf_counter_ns() - t0) / 1e3
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self._flush.fill_(1)  # a write of >= 2x L2 evicts whatever the setup or the last trial left there
        # Keep the GPU busy while the host queues the call: without this cushion, a replacement with Python-heavy
        # dispatch leaves the GPU idle between the events and its launch overhead is timed as kernel time (seen on
        # the H200: class-target patches measured 5x slower than their in-model profile).
        torch.cuda._sleep(self._cushion_cycles)
        start.record()
        t0 = time.perf_counter_ns()
        call()
        self.last_host_us = (time.perf_counter_ns() - t0) / 1e3
        end.record()
        self.sync()
        return start.elapsed_time(end) * 1e3

    def _grow_cushion(self, host_us: float) -> bool:
        """Lengthen the cushion when queueing a call took the host nearly as long as the spin lasts; True if it grew."""
        wanted = cushion_for(host_us, self.cushion_us)
        if wanted is None:
            return False
        self.cushion_us = wanted
        self._cushion_cycles = spin_cycles(self.device, wanted)
        return True

    def wall_seconds(self, call: Callable[[], object]) -> float:
        """Host seconds of one call between device-wide synchronizes (cold calls: JIT, autotune, compilation)."""
        self.sync()
        t0 = time.perf_counter()
        call()
        self.sync()
        return time.perf_counter() - t0

    def measure(self, setup: Callable[[], Callable[[], object]], trials: int, warmup: int) -> Samples:
        """`warmup` untimed then `trials` timed calls; `setup()` makes each trial's fresh inputs and returns the call."""
        for _ in range(warmup):
            setup()()
        self.sync()
        for _attempt in range(3):
            samples, host_us = [], 0.0
            for _ in range(trials):
                call = setup()
                self.sync()  # input generation is finished before the clock starts
                samples.append(self.trial(call))
                host_us = max(host_us, self.last_host_us)
            # A forward + backward through a Python-dispatched op can take the host longer to queue than the spin
            # lasts (seen on the H200: fastsoftmax fwd+bwd 89 us above its two kernels): then the GPU idled inside
            # the timed interval. Measure again with a cushion longer than the slowest queueing seen.
            if not (self.cuda and self._grow_cushion(host_us)):
                break
        return Samples(tuple(samples))

    @property
    def copy_bytes(self) -> int:
        return COPY_BYTES.get(self.device.type, COPY_BYTES["cpu"])

    def copy_samples(self, trials: int, nbytes: int | None = None) -> Samples:
        """Raw times of a device-to-device copy of `nbytes` (default copy_bytes), timed like the ops."""
        nbytes = nbytes or self.copy_bytes
        src = torch.empty(nbytes, dtype=torch.uint8, device=self.device).random_()
        dst = torch.empty_like(src)
        copy = dst.copy_  # bound once: the buffers are freed when this method returns
        return self.measure(lambda: (lambda: copy(src)), trials, warmup=3)


def cushion_for(host_us: float, cushion_us: float, margin: float = 0.8) -> float | None:
    """A longer GPU cushion when the host's queueing time reached `margin` of the current one (twice the queueing
    time, so ordinary jitter does not reach it again), else None."""
    if host_us < margin * cushion_us:
        return None
    return 2.0 * host_us


def copy_rates(samples: Samples, nbytes: int) -> tuple[float, float]:
    """(median, fastest-decile) copy bandwidth in GB/s from a copy's samples: the roofline and its noisy upper edge."""
    moved = 2 * nbytes  # read + written
    return moved / samples.median / 1e3, moved / samples.p10 / 1e3  # bytes per microsecond / 1e3 = GB/s
