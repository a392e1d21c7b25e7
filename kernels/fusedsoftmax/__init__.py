"""Attention's scale + additive (causal) mask + softmax in one pass (Triton on CUDA, real CPU implementation).

`fusedsoftmax(scores, mask, scale, out_dtype)` calls the named op `torch.ops.e2eprof.fusedsoftmax`; `IMPL_CALLS`
counts which implementation ran; `reference_fusedsoftmax` is the fp64 yardstick. patch.py replaces GPT-2's
`eager_attention_forward` with a version whose matmuls stay torch.matmul and whose softmax chain is this op.
"""

from .op import IMPL_CALLS, TRITON_AVAILABLE, fusedsoftmax, reference_fusedsoftmax

__all__ = ["fusedsoftmax", "reference_fusedsoftmax", "IMPL_CALLS", "TRITON_AVAILABLE"]
