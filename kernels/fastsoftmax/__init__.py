"""Softmax that reads its input dtype and writes any float dtype in one pass (Triton on CUDA, real CPU fallback).

`fastsoftmax(x, dim, out_dtype)` calls the named op `torch.ops.e2eprof.fastsoftmax`; `IMPL_CALLS` counts which
implementation ran; `reference_softmax` is the fp64 yardstick. TRITON_AVAILABLE is False when triton cannot be
imported: CPU tensors still work, CUDA tensors raise.
"""

from .op import IMPL_CALLS, TRITON_AVAILABLE, fastsoftmax, reference_softmax

__all__ = ["fastsoftmax", "reference_softmax", "IMPL_CALLS", "TRITON_AVAILABLE"]
