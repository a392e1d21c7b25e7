"""planted-slowdown: GPT-2's softmax computed by the stock function, then E2EPROF_PLANTED_DELAY_US of extra work.

On CUDA the extra work is a `torch.cuda._sleep` spin (e2eprof.gpu_spin): device work of known length that sits in
the stream like any kernel (the host does not wait).
On the CPU the extra work is a busy-wait of the same length on the calling thread.
Outputs are the stock outputs bit for bit, so every correctness check passes: only the timing may tell.
"""

from __future__ import annotations

import os
import time
from collections import Counter

import torch
import torch.nn.functional as F

from e2eprof.gpu_spin import spin_cycles
from e2eprof.kernels.fastsoftmax.patch import softmax_reference
from e2eprof.patch import Patch

DELAY_ENV = "E2EPROF_PLANTED_DELAY_US"
DEFAULT_DELAY_US = 50.0
IMPL_CALLS: Counter = Counter()
_STOCK_SOFTMAX = F.softmax


def delay_us() -> float:
    raw = os.environ.get(DELAY_ENV, str(DEFAULT_DELAY_US))
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{DELAY_ENV} must be a number of microseconds, got {raw!r}") from None
    if not 0 <= value < 1e6:
        raise ValueError(f"{DELAY_ENV} must be between 0 and 1e6 microseconds, got {value}")
    return value


def _spin(device: torch.device, microseconds: float) -> None:
    if microseconds <= 0:
        return
    if device.type == "cuda":
        torch.cuda._sleep(spin_cycles(device, microseconds))
        IMPL_CALLS["cuda.spin"] += 1
    else:
        deadline = time.perf_counter() + microseconds / 1e6
        while time.perf_counter() < deadline:
            pass
        IMPL_CALLS["cpu.spin"] += 1


def slow_softmax(input: torch.Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: torch.dtype | None = None) -> torch.Tensor:
    """F.softmax's result, then the planted delay."""
    out = _STOCK_SOFTMAX(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)
    _spin(input.device, delay_us())
    return out


PATCH = Patch(
    name="planted-slowdown",
    description=f"stock softmax plus ${DELAY_ENV} (default {DEFAULT_DELAY_US:g}) us of extra work per call; a known slowdown",
    targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
    replacement=slow_softmax,
    reference=softmax_reference,
    architectures=("gpt2",),
    attn_implementation="eager",
    implementations=lambda: dict(IMPL_CALLS),
    kernel_names=("spin_kernel",),
)
