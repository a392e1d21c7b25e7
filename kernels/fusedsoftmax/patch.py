"""Model-facing side of fusedsoftmax: a drop-in for GPT-2's `eager_attention_forward`, declared as a patch.

The stock function (transformers 5.17 and 5.24 alike) is

    attn_weights = torch.matmul(query, key.transpose(-1, -2)) * scaling
    attn_weights = attn_weights + attention_mask        # (B, 1, T, S) additive causal (+ padding) mask, fp32
    attn_weights = nn.functional.softmax(attn_weights, dim=-1)
    attn_weights = attn_weights.type(value.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value).transpose(1, 2)

Under CUDA autocast the scores are bf16, the fp32 mask promotes them, softmax runs in fp32 and the result is cast
back to bf16: four full passes over the (B, nh, T, S) tensor. The replacement keeps both matmuls (cuBLAS, same
autocast behaviour) and does scale + mask + softmax + cast in one kernel that reads the bf16 scores and writes
the probabilities in the dtype the stock chain ends with. That dtype is asked of the stock function itself, once
per (device, dtypes, autocast state), on 1-element tensors, rather than re-deriving autocast's rules.

Dropout is applied exactly as the stock function does (the same torch call on a tensor of the same shape, dtype and
device, so the same random mask for the same RNG state). transformers 5.x dropped GPT-2's head_mask argument; like
the stock function, the replacement ignores any extra keyword (position_ids, ...). The causal mask is whatever the
model passes as attention_mask (transformers builds it as an additive (B, 1, T, S) tensor for eager attention); with
attention_mask=None the stock function masks nothing, and neither does this one.
"""

from __future__ import annotations

import functools
import types

import torch
import torch.nn.functional as F
from transformers.models.gpt2 import modeling_gpt2

from e2eprof.kernels.fusedsoftmax.op import IMPL_CALLS, fusedsoftmax, reference_fusedsoftmax
from e2eprof.checks import stress
from e2eprof.patch import DEFAULT_TOLERANCES, Patch

# Captured at import, before any patch is installed: the genuine stock function.
_STOCK_EAGER_ATTENTION = modeling_gpt2.eager_attention_forward
_EVAL_MODULE = types.SimpleNamespace(training=False)  # the probe must not draw dropout randomness


@functools.lru_cache(maxsize=64)
def _stock_weights_dtype(device_type: str, q_dtype: torch.dtype, k_dtype: torch.dtype, v_dtype: torch.dtype,
                         mask_dtype: torch.dtype | None, autocast_on: bool,
                         autocast_dtype: torch.dtype | None) -> torch.dtype:
    """dtype of the attention probabilities the stock function returns for these inputs and autocast state."""
    def probe(dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(1, 1, 1, 1, dtype=dtype, device=device_type)  # (B, H, T, D) = (1, 1, 1, 1)

    mask = probe(mask_dtype) if mask_dtype is not None else None
    with torch.no_grad(), torch.autocast(device_type, dtype=autocast_dtype, enabled=autocast_on):
        _, weights = _STOCK_EAGER_ATTENTION(_EVAL_MODULE, probe(q_dtype), probe(k_dtype), probe(v_dtype), mask)
    return weights.dtype


def _weights_dtype(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None) -> torch.dtype:
    device_type = query.device.type
    autocast_on = torch.is_autocast_enabled(device_type)
    autocast_dtype = torch.get_autocast_dtype(device_type) if autocast_on else None
    mask_dtype = attention_mask.dtype if attention_mask is not None else None
    return _stock_weights_dtype(device_type, query.dtype, key.dtype, value.dtype, mask_dtype, autocast_on,
                                autocast_dtype)


def fused_eager_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """GPT-2's `eager_attention_forward` (same signature, same (attn_output, attn_weights) result) with the
    scale + mask + softmax + cast chain computed by `e2eprof::fusedsoftmax`."""
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    scores = torch.matmul(query, key.transpose(-1, -2))  # (B, nh, T, S), unscaled; bf16 under CUDA autocast
    attn_weights = fusedsoftmax(scores, attention_mask, scaling, _weights_dtype(query, key, value, attention_mask))
    attn_weights = F.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value)  # (B, nh, T, hs)
    return attn_output.transpose(1, 2), attn_weights


def eager_attention_reference(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """fp64 reference with `eager_attention_forward`'s signature (the engine passes float64 tensors).

    No dropout: a random mask has no fp64 twin, so the engine verifies in eval mode, where the stock function
    applies none either.
    """
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    scores = torch.matmul(query.double(), key.double().transpose(-1, -2))  # (B, nh, T, S)
    attn_weights = reference_fusedsoftmax(scores, attention_mask, scaling)
    attn_output = torch.matmul(attn_weights, value.double())
    return attn_output.transpose(1, 2), attn_weights


PATCH = Patch(
    name="fusedsoftmax",
    description="GPT-2 eager attention with scale + causal mask + softmax + cast in one Triton pass "
                "(forward+backward); matmuls stay cuBLAS",
    targets=("transformers.models.gpt2.modeling_gpt2:eager_attention_forward",),
    replacement=fused_eager_attention_forward,
    reference=eager_attention_reference,
    architectures=("gpt2",),
    attn_implementation="eager",
    implementations=lambda: dict(IMPL_CALLS),
    kernel_names=("_fusedsoftmax_fwd", "_fusedsoftmax_bwd"),
    # The stock defaults: outputs are attention outputs and probabilities, compared as any other activation;
    # above the floors, the stock path's own error (times error_factor) is the yardstick.
    tolerances=dict(DEFAULT_TOLERANCES),
    domain=stress.attention,  # the query across its range, and fully masked rows of the mask
)
