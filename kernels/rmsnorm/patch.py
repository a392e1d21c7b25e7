"""Model-facing side of rmsnorm: LlamaRMSNorm computed by one fused kernel, declared as a patch.

Every Llama decoder layer normalises the residual stream twice (input_layernorm, post_attention_layernorm) and the
model once more at the end. The stock module is a chain of eager ops (cast to fp32, square, mean, rsqrt, multiply,
cast back, weight multiply); the kernel reads each row once and writes it once, with the same numerics.

The target is the class in modeling_llama: the engine swaps the class of the model's own instances (and the name in
modeling_llama for models built later), so nothing outside Llama models changes.
"""

from __future__ import annotations

import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from e2eprof.kernels.rmsnorm.op import IMPL_CALLS, reference_rmsnorm, rmsnorm
from e2eprof.patch import Patch


class FusedLlamaRMSNorm(LlamaRMSNorm):
    """LlamaRMSNorm whose forward is `e2eprof::rmsnorm` (same weight, same eps, same output dtype)."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rmsnorm(hidden_states, self.weight, self.variance_epsilon)


def rmsnorm_module_reference(module: LlamaRMSNorm, hidden_states: torch.Tensor) -> torch.Tensor:
    """fp64 reference of a LlamaRMSNorm forward (the engine passes the module, then float64 hidden states)."""
    return reference_rmsnorm(hidden_states, module.weight, module.variance_epsilon)


PATCH = Patch(
    name="rmsnorm",
    description="Triton RMSNorm (forward+backward, one read and one write per row) for every LlamaRMSNorm",
    targets=("transformers.models.llama.modeling_llama:LlamaRMSNorm",),
    replacement=FusedLlamaRMSNorm,
    reference=rmsnorm_module_reference,
    architectures=("llama",),
    implementations=lambda: dict(IMPL_CALLS),
    kernel_names=("_rmsnorm_fwd", "_rmsnorm_bwd"),
    # Relative-norm error floors by output dtype: a few roundings of the dtype over a row, as for fastsoftmax.
    tolerances={"float64": 1e-10, "float32": 1e-5, "bfloat16": 1e-2, "float16": 2e-3},
)
