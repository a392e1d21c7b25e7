"""GELU in one pass forward and one pass backward (Triton on CUDA, real CPU implementation): GPT-2's tanh
approximation (`gelu_new`, approximate="tanh", the default) and BERT's exact erf GELU (`gelu`, approximate="none").

`fastgelu(x, out_dtype, approximate)` calls the named op `torch.ops.e2eprof.fastgelu`; `IMPL_CALLS` counts which
implementation ran; `reference_gelu(x, approximate)` is the fp64 yardstick. TRITON_AVAILABLE is False when triton cannot
be imported: CPU tensors still work, CUDA tensors raise.
"""

from .op import IMPL_CALLS, TRITON_AVAILABLE, fastgelu, reference_gelu

__all__ = ["fastgelu", "reference_gelu", "IMPL_CALLS", "TRITON_AVAILABLE"]
