"""RMSNorm as Llama computes it, in one pass per row (Triton on CUDA, real CPU fallback).

`rmsnorm(x, weight, eps)` calls the named op `torch.ops.e2eprof.rmsnorm`; `IMPL_CALLS` counts which implementation
ran; `reference_rmsnorm` is the fp64 yardstick. TRITON_AVAILABLE is False when triton cannot be imported: CPU tensors
still work, CUDA tensors raise.
"""

from .op import IMPL_CALLS, TRITON_AVAILABLE, reference_rmsnorm, rmsnorm

__all__ = ["rmsnorm", "reference_rmsnorm", "IMPL_CALLS", "TRITON_AVAILABLE"]
