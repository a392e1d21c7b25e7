"""GPU work of a known length: `torch.cuda._sleep` spins for a number of cycles, measured here per microsecond.

Used where e2eprof needs device time it controls: the planted-slowdown patch (a known extra cost per call) and the
microbenchmark timer (a cushion that keeps the GPU busy while the host queues the timed call). Cycles per
microsecond are measured once per device with CUDA events on a long spin, not taken from the nominal clock,
which the card may not hold.
"""

from __future__ import annotations

import functools

import torch

_PROBE_CYCLES = 20_000_000


@functools.lru_cache(maxsize=8)
def cycles_per_us(device_index: int) -> float:
    with torch.cuda.device(device_index):
        torch.cuda._sleep(_PROBE_CYCLES // 10)  # the first launch pays module loading
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(_PROBE_CYCLES)
        end.record()
        end.synchronize()
        return _PROBE_CYCLES / (start.elapsed_time(end) * 1e3)


def device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def spin_cycles(device: torch.device, microseconds: float) -> int:
    """The `torch.cuda._sleep` argument that spins `device` for about `microseconds`."""
    return int(microseconds * cycles_per_us(device_index(device)))
