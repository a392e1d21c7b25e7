"""Model-facing side of fastlayernorm: the nn.LayerNorm modules of GPT-2 (ln_1, ln_2 per block, ln_f) and BERT
(embeddings, attention output and FFN output per layer, the MLM head's transform), declared as a patch.

Both build their norms as `nn.LayerNorm(hidden_size, eps=...)` through their modeling module's own `nn` name. The
patch has a class target on each of those names: the engine replaces `nn.LayerNorm` only as modeling_gpt2 and
modeling_bert see it (through a proxy of torch.nn, so torch.nn.LayerNorm stays stock for the rest of the process)
and swaps the class of the model's existing LayerNorm instances to FastLayerNorm (GPT-2: 2 * n_layer + 1 of them;
BERT: 2 * n_layer + 2), counted under the model's own target, the other counting zero; revert puts all back.

Output dtype: layer_norm is on autocast's fp32 list on CUDA (under bf16 autocast GPT-2's norms read the fp32
residual stream and write fp32), and without autocast it follows the input (CPU accepts bf16 input with fp32
parameters). Rather than encode those rules, we ask the stock function once per (device, dtypes, autocast state)
on a 1x2 probe, as fastsoftmax does; dtype combinations the stock op rejects raise its own error here too.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from e2eprof.kernels.fastlayernorm.op import IMPL_CALLS, fastlayernorm, reference_layer_norm
from e2eprof.patch import Patch

# Captured at import, before any patch is installed: the genuine stock function.
_STOCK_LAYER_NORM = F.layer_norm


@functools.lru_cache(maxsize=64)
def _stock_output_dtype(device_type: str, x_dtype: torch.dtype, weight_dtype: torch.dtype | None,
                        bias_dtype: torch.dtype | None, autocast_on: bool,
                        autocast_dtype: torch.dtype | None) -> torch.dtype:
    probe = torch.zeros(1, 2, dtype=x_dtype, device=device_type)
    weight = None if weight_dtype is None else torch.ones(2, dtype=weight_dtype, device=device_type)
    bias = None if bias_dtype is None else torch.zeros(2, dtype=bias_dtype, device=device_type)
    with torch.autocast(device_type, dtype=autocast_dtype, enabled=autocast_on):
        return _STOCK_LAYER_NORM(probe, (2,), weight, bias).dtype


def layer_norm_like_torch(input: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None = None,
                          bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """`torch.nn.functional.layer_norm` with the same signature and output dtype, computed by fastlayernorm."""
    device_type = input.device.type
    autocast_on = torch.is_autocast_enabled(device_type)
    autocast_dtype = torch.get_autocast_dtype(device_type) if autocast_on else None
    out_dtype = _stock_output_dtype(device_type, input.dtype, None if weight is None else weight.dtype,
                                    None if bias is None else bias.dtype, autocast_on, autocast_dtype)
    return fastlayernorm(input, normalized_shape, weight, bias, eps, out_dtype)


class FastLayerNorm(torch.nn.LayerNorm):
    """nn.LayerNorm whose forward runs `e2eprof::fastlayernorm` (same parameters, same state dict)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return layer_norm_like_torch(input, self.normalized_shape, self.weight, self.bias, self.eps)


def layer_norm_reference(module: torch.nn.LayerNorm, input: torch.Tensor) -> torch.Tensor:
    """fp64 reference with the replaced forward's signature (module first, as for any class target)."""
    return reference_layer_norm(input, module.normalized_shape, module.weight, module.bias, module.eps)


PATCH = Patch(
    name="fastlayernorm",
    description="Triton LayerNorm (one pass forward, one pass backward with atomic-free dweight/dbias) in GPT-2 and BERT",
    targets=("transformers.models.gpt2.modeling_gpt2:nn.LayerNorm", "transformers.models.bert.modeling_bert:nn.LayerNorm"),
    replacement=FastLayerNorm,
    reference=layer_norm_reference,
    architectures=("gpt2", "bert"),
    implementations=lambda: dict(IMPL_CALLS),
    kernel_names=("_layernorm_fwd", "_layernorm_bwd"),
    # Relative-norm floors by output dtype: a few units of the dtype's rounding; the row statistics are fp32, so
    # the output's own rounding dominates, as for fastsoftmax.
    tolerances={"float64": 1e-10, "float32": 1e-5, "bfloat16": 1e-2, "float16": 2e-3},
)
