"""SwiGLU, silu(gate) * up, in one pass (Triton on CUDA, real CPU fallback), for Llama-family MLPs.

`swiglu(gate, up)` calls the named op `torch.ops.e2eprof.swiglu`; `IMPL_CALLS` counts which implementation ran;
`reference_swiglu` is the fp64 yardstick. TRITON_AVAILABLE is False when triton cannot be imported: CPU tensors
still work, CUDA tensors raise.
"""

from .op import IMPL_CALLS, TRITON_AVAILABLE, reference_swiglu, swiglu

__all__ = ["swiglu", "reference_swiglu", "IMPL_CALLS", "TRITON_AVAILABLE"]
