"""Liger's RMSNorm, LayerNorm and SwiGLU as class targets: subclasses of the modules they replace, same weights.

Liger's kernels return the input dtype; the stock modules return what PyTorch's type promotion (and autocast, for
LayerNorm) gives, so each adapter casts to the stock output dtype: the model downstream sees the dtype it always saw.
"""

from __future__ import annotations

import torch
from liger_kernel.transformers.functional import liger_layer_norm, liger_rms_norm, liger_swiglu
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

from e2eprof.kernels.fastlayernorm.patch import _stock_output_dtype, layer_norm_reference
from e2eprof.kernels.rmsnorm.patch import rmsnorm_module_reference
from e2eprof.kernels.swiglu.patch import mlp_module_reference
from e2eprof.patch import Patch


class LigerLlamaRMSNorm(LlamaRMSNorm):
    """LlamaRMSNorm computed by Liger's RMSNorm kernel in its "llama" casting mode (fp32 statistics)."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # Stock: weight * x.to(input dtype), so the output has the promoted dtype of weight and input.
        out = liger_rms_norm(hidden_states, self.weight, self.variance_epsilon, casting_mode="llama")
        return out.to(torch.promote_types(self.weight.dtype, hidden_states.dtype))


class LigerLayerNorm(torch.nn.LayerNorm):
    """nn.LayerNorm (GPT-2, BERT) computed by Liger's LayerNorm kernel."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        device_type = input.device.type
        autocast_on = torch.is_autocast_enabled(device_type)
        weight = self.weight if self.weight is not None else input.new_ones(self.normalized_shape)
        bias = self.bias if self.bias is not None else input.new_zeros(self.normalized_shape)
        out_dtype = _stock_output_dtype(device_type, input.dtype, None if self.weight is None else weight.dtype,
                                        None if self.bias is None else bias.dtype, autocast_on,
                                        torch.get_autocast_dtype(device_type) if autocast_on else None)
        return liger_layer_norm(input, weight, bias, self.eps).to(out_dtype)


class LigerSwiGLULlamaMLP(LlamaMLP):
    """LlamaMLP whose silu(gate) * up is Liger's fused SwiGLU kernel (the projections stay cuBLAS)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.config.hidden_act not in ("silu", "swish"):
            raise ValueError(f"liger-swiglu needs hidden_act silu, this model uses {self.config.hidden_act!r}")
        return self.down_proj(liger_swiglu(self.gate_proj(x), self.up_proj(x)))


RMSNORM = Patch(
    name="liger-rmsnorm",
    description="Liger-Kernel RMSNorm (Triton) for every LlamaRMSNorm",
    targets=("transformers.models.llama.modeling_llama:LlamaRMSNorm",),
    replacement=LigerLlamaRMSNorm,
    reference=rmsnorm_module_reference,
    architectures=("llama",),
    kernel_names=("_rms_norm_forward_kernel", "_rms_norm_backward_kernel"),
    requires_triton=True,
)

LAYERNORM = Patch(
    name="liger-layernorm",
    description="Liger-Kernel LayerNorm (Triton) for nn.LayerNorm in GPT-2 and BERT",
    targets=("transformers.models.gpt2.modeling_gpt2:nn.LayerNorm", "transformers.models.bert.modeling_bert:nn.LayerNorm"),
    replacement=LigerLayerNorm,
    reference=layer_norm_reference,
    architectures=("gpt2", "bert"),
    kernel_names=("_layer_norm_forward_kernel", "_layer_norm_backward_kernel"),
    requires_triton=True,
)

SWIGLU = Patch(
    name="liger-swiglu",
    description="Liger-Kernel SwiGLU (Triton silu(gate) * up, forward+backward) in every LlamaMLP",
    targets=("transformers.models.llama.modeling_llama:LlamaMLP",),
    replacement=LigerSwiGLULlamaMLP,
    reference=mlp_module_reference,
    architectures=("llama",),
    kernel_names=("_swiglu_forward_kernel", "_swiglu_backward_kernel"),
    requires_triton=True,
)
