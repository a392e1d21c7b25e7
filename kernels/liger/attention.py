"""Liger's softmax (eager attention of GPT-2, BERT and Llama) and RoPE (Llama) as function targets.

Both adapters keep the replaced function's signature. Liger's softmax normalises the last dimension and returns
the input dtype; the adapter moves `dim` last and computes in the dtype the stock call returns in the same autocast
state.
Liger's RoPE rotates q and k in place and returns them: the gate's input_mutated check reports that, by design.
"""

from __future__ import annotations

import torch
from liger_kernel.transformers.functional import liger_softmax
from liger_kernel.transformers.rope import liger_rotary_pos_emb

from e2eprof.kernels.fastsoftmax.patch import _legacy_softmax_dim, _stock_output_dtype, softmax_reference
from e2eprof.patch import Patch


def liger_softmax_like_torch(input: torch.Tensor, dim: int | None = None, _stacklevel: int = 3,
                             dtype: torch.dtype | None = None) -> torch.Tensor:
    """`torch.nn.functional.softmax`'s signature and output dtype, computed by Liger's softmax kernel."""
    if dim is None:
        dim = _legacy_softmax_dim(input.dim())
    device_type = input.device.type
    autocast_on = torch.is_autocast_enabled(device_type)
    out_dtype = _stock_output_dtype(device_type, input.dtype, dtype, autocast_on,
                                    torch.get_autocast_dtype(device_type) if autocast_on else None)
    # Computed in the dtype the stock call returns: under autocast softmax runs in fp32 (an fp32-list op), and a
    # bf16 result cast up afterwards would carry bf16 rounding the stock path never has.
    x = input.to(out_dtype).movedim(dim, -1)
    return liger_softmax(x.contiguous()).movedim(-1, dim)


def _rope_arguments(q, k, cos, sin, unsqueeze_dim=1):
    return q, k, cos, sin, unsqueeze_dim


def liger_rope_like_llama(*args, **kwargs):
    """modeling_llama.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1), computed by Liger's RoPE kernel. The stock
    name is wrapped by transformers' kernel-hub decorator, which takes (*args, **kwargs): so does this."""
    q, k, cos, sin, unsqueeze_dim = _rope_arguments(*args, **kwargs)
    return liger_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_reference(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1):
    """fp64 rotary embedding as Llama defines it (the engine passes float64 q, k, cos, sin)."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


SOFTMAX = Patch(
    name="liger-softmax",
    description="Liger-Kernel softmax (Triton) in the eager attention of GPT-2, BERT and Llama",
    targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",
             "transformers.models.bert.modeling_bert:nn.functional.softmax",
             "transformers.models.llama.modeling_llama:nn.functional.softmax"),
    replacement=liger_softmax_like_torch,
    reference=softmax_reference,
    architectures=("gpt2", "bert", "llama"),
    attn_implementation="eager",
    kernel_names=("_softmax_single_block_forward_kernel", "_softmax_multi_block_forward_kernel"),
    domain="softmax",
    requires_triton=True,
)

ROPE = Patch(
    name="liger-rope",
    description="Liger-Kernel rotary position embedding (Triton, q and k in one kernel, in place) in Llama attention",
    targets=("transformers.models.llama.modeling_llama:apply_rotary_pos_emb",),
    replacement=liger_rope_like_llama,
    reference=rope_reference,
    architectures=("llama",),
    kernel_names=("_triton_rope",),
    requires_triton=True,
)
