"""Model-facing side of swiglu: LlamaMLP with silu(gate) * up fused into one kernel, declared as a patch.

LlamaMLP computes down_proj(act_fn(gate_proj(x)) * up_proj(x)). The three projections stay cuBLAS matmuls; the
kernel replaces the two eager elementwise ops between them (silu, then mul) and their backward, which otherwise
write and re-read an intermediate-sized temporary.

The target is the class in modeling_llama: the engine swaps the class of the model's own instances (and the name in
modeling_llama for models built later), so nothing outside Llama models changes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN
from transformers.models.llama.modeling_llama import LlamaMLP

from e2eprof.kernels.swiglu.op import IMPL_CALLS, reference_swiglu, swiglu
from e2eprof.patch import Patch

# What ACT2FN builds for hidden_act "silu" in this transformers version (SiLUActivation in 5.x, nn.SiLU before).
_SILU_TYPES = (type(ACT2FN["silu"]), torch.nn.SiLU)


class FusedSwiGLULlamaMLP(LlamaMLP):
    """LlamaMLP whose silu(gate) * up is `e2eprof::swiglu`; gate_proj, up_proj and down_proj are unchanged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(self.act_fn, _SILU_TYPES):
            # The kernel computes silu; a Llama variant with another activation must not be silently changed.
            raise RuntimeError(f"swiglu fuses silu(gate) * up, but this LlamaMLP's activation is "
                               f"{type(self.act_fn).__name__}")
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


def _linear64(layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, layer.weight.double(), None if layer.bias is None else layer.bias.double())


def mlp_module_reference(module: LlamaMLP, x: torch.Tensor) -> torch.Tensor:
    """fp64 reference of the whole MLP forward (the engine passes the module, then float64 hidden states)."""
    return _linear64(module.down_proj, reference_swiglu(_linear64(module.gate_proj, x), _linear64(module.up_proj, x)))


PATCH = Patch(
    name="swiglu",
    description="Triton SwiGLU (silu(gate) * up, forward+backward in one pass) inside every LlamaMLP",
    targets=("transformers.models.llama.modeling_llama:LlamaMLP",),
    replacement=FusedSwiGLULlamaMLP,
    reference=mlp_module_reference,
    architectures=("llama",),
    implementations=lambda: dict(IMPL_CALLS),
    kernel_names=("_swiglu_fwd", "_swiglu_bwd"),
    # Relative-norm error floors of the MLP output by dtype; the stock path's own error is the yardstick above them.
    tolerances={"float64": 1e-10, "float32": 1e-5, "bfloat16": 1e-2, "float16": 2e-3},
)
