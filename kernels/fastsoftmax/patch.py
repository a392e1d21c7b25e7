"""Model-facing side of fastsoftmax: a drop-in for `torch.nn.functional.softmax`, declared as a patch.

GPT-2's eager attention calls `nn.functional.softmax(attn_weights, dim=-1)` on its (B, nh, T, T) scores. Under
CUDA autocast the scores are bf16 and softmax is on autocast's fp32 list, so the stock path first casts the
scores to fp32 (one extra read and write of the biggest tensor in the layer) and then softmaxes. Our kernel
reads bf16 and writes fp32 in one pass. The output dtype must be exactly what the stock call would return in
the same autocast state, so we ask the stock op once per (device, dtype, autocast state) on a 1-element tensor
instead of re-implementing autocast's policy tables (they differ between CPU and CUDA and across releases).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from e2eprof.kernels.fastsoftmax.op import IMPL_CALLS, fastsoftmax, reference_softmax
from e2eprof.patch import Patch

# Captured at import, before any patch is installed: the genuine stock function.
_STOCK_SOFTMAX = F.softmax


def _legacy_softmax_dim(ndim: int) -> int:
    # torch.nn.functional._get_softmax_dim: what F.softmax does when called without dim.
    return 0 if ndim in (0, 1, 3) else 1


@functools.lru_cache(maxsize=64)
def _stock_output_dtype(device_type: str, in_dtype: torch.dtype, dtype: torch.dtype | None, autocast_on: bool, autocast_dtype: torch.dtype | None) -> torch.dtype:
    probe = torch.zeros(1, 1, dtype=in_dtype, device=device_type)
    with torch.autocast(device_type, dtype=autocast_dtype, enabled=autocast_on):
        return _STOCK_SOFTMAX(probe, dim=-1, dtype=dtype).dtype


def softmax_like_torch(input: torch.Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`torch.nn.functional.softmax` with the same signature and output dtype, computed by fastsoftmax."""
    if dim is None:
        dim = _legacy_softmax_dim(input.dim())
    device_type = input.device.type
    autocast_on = torch.is_autocast_enabled(device_type)
    autocast_dtype = torch.get_autocast_dtype(device_type) if autocast_on else None
    out_dtype = _stock_output_dtype(device_type, input.dtype, dtype, autocast_on, autocast_dtype)
    return fastsoftmax(input, dim=dim, out_dtype=out_dtype)


def softmax_reference(input: torch.Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: torch.dtype | None = None) -> torch.Tensor:
    """fp64 reference with F.softmax's signature (the engine passes float64 inputs)."""
    if dim is None:
        dim = _legacy_softmax_dim(input.dim())
    return reference_softmax(input, dim=dim)


PATCH = Patch(
    name="fastsoftmax",
    description="Triton softmax (forward+backward, reads bf16 writes fp32 in one pass) in GPT-2 eager attention",
    targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
    replacement=softmax_like_torch,
    reference=softmax_reference,
    architectures=("gpt2",),
    attn_implementation="eager",
    implementations=lambda: dict(IMPL_CALLS),
    kernel_names=("_softmax_fwd", "_softmax_bwd"),
    domain="softmax",  # attention scores: also fully masked rows and -inf/NaN at padded places
)
