"""LayerNorm in one pass forward and one pass backward, dweight/dbias reduced without atomics (Triton on CUDA, real
CPU fallback).

`fastlayernorm(x, normalized_shape, weight, bias, eps, out_dtype)` calls the named op
`torch.ops.e2eprof.fastlayernorm`; `IMPL_CALLS` counts which implementation ran; `reference_layer_norm` is the fp64
yardstick. TRITON_AVAILABLE is False when triton cannot be imported: CPU tensors still work, CUDA tensors raise.
"""

from .op import IMPL_CALLS, TRITON_AVAILABLE, fastlayernorm, reference_layer_norm

__all__ = ["fastlayernorm", "reference_layer_norm", "IMPL_CALLS", "TRITON_AVAILABLE"]
