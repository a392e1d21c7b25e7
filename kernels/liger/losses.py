"""Liger's cross entropy and fused linear cross entropy (FLCE) as patches.

liger-cross-entropy replaces `nn.functional.cross_entropy` as transformers' loss functions see it (the causal-LM
and masked-LM losses of GPT-2, Llama and BERT). Liger's kernel writes the gradient into the logits in place during
the forward: the gate's input_mutated check reports that, by design.

liger-flce (Llama) and liger-flce-gpt2 replace the causal-LM head: with labels and gradients on, the last hidden states
and lm_head's weight go straight into Liger's FLCE, chunk by chunk, so the (B, T, V) logits are never materialised
(Liger's memory claim). The model then returns the loss but no logits (omitted_outputs): the gate compares the loss
and every gradient. Under no_grad (inference), or without labels, the stock forward runs: the patch is training-only.
Gradient mode decides, not module.training: e2eprof's gradient capture runs the training step in eval mode (no
dropout), and that capture must go through FLCE like the timed steps do.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from liger_kernel.transformers.functional import liger_cross_entropy
from liger_kernel.transformers.model.loss_utils import LigerForCausalLMLoss
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.models.gpt2.modeling_gpt2 import GPT2LMHeadModel
from transformers.models.llama.modeling_llama import LlamaForCausalLM

from e2eprof.patch import Patch


def liger_cross_entropy_like_torch(input: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None,
                                   size_average=None, ignore_index: int = -100, reduce=None, reduction: str = "mean",
                                   label_smoothing: float = 0.0) -> torch.Tensor:
    """`torch.nn.functional.cross_entropy`'s signature, computed by Liger's cross-entropy kernel."""
    return liger_cross_entropy(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing)


def cross_entropy_reference(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                            reduction="mean", label_smoothing=0.0):
    """fp64 cross entropy (the engine passes float64 logits; the labels stay integers)."""
    return F.cross_entropy(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing)


# What the head's forward takes that the base model does not (and that FLCE consumes instead).
_HEAD_ONLY = ("self", "labels", "logits_to_keep", "return_dict", "kwargs")


def _flce_forward(model, stock_forward, base: torch.nn.Module, args: tuple, kwargs: dict):
    """Labels and gradients on: base model, then Liger's FLCE on the hidden states; otherwise the stock forward."""
    bound = inspect.signature(stock_forward).bind(model, *args, **kwargs)
    labels = bound.arguments.get("labels")
    if labels is None or not torch.is_grad_enabled():
        return stock_forward(model, *args, **kwargs)
    inputs = {k: v for k, v in bound.arguments.items() if k not in _HEAD_ONLY and v is not None}
    inputs.update(bound.arguments.get("kwargs", {}))
    outputs = base(**inputs)
    hidden = outputs[0]  # (B, T, hidden)
    head = model.lm_head
    loss = LigerForCausalLMLoss(hidden, head.weight, labels, model.config.hidden_size,
                                **({"bias": head.bias} if head.bias is not None else {}))
    return CausalLMOutputWithPast(loss=loss, logits=None)  # a training step: no cache to hand back


class LigerFLCELlamaForCausalLM(LlamaForCausalLM):
    """LlamaForCausalLM whose training loss is Liger's fused linear cross entropy (no logits)."""

    def forward(self, *args, **kwargs):
        return _flce_forward(self, LlamaForCausalLM.forward, self.model, args, kwargs)


class LigerFLCEGPT2LMHeadModel(GPT2LMHeadModel):
    """GPT2LMHeadModel whose training loss is Liger's fused linear cross entropy (no logits)."""

    def forward(self, *args, **kwargs):
        return _flce_forward(self, GPT2LMHeadModel.forward, self.transformer, args, kwargs)


CROSS_ENTROPY = Patch(
    name="liger-cross-entropy",
    description="Liger-Kernel cross entropy (Triton, gradient computed in the forward, in place) in the LM losses",
    targets=("transformers.loss.loss_utils:nn.functional.cross_entropy",),
    replacement=liger_cross_entropy_like_torch,
    reference=cross_entropy_reference,
    architectures=("gpt2", "llama", "bert"),
    kernel_names=("liger_cross_entropy_kernel",),
    domain="none",  # labels index the logits: the stress points' shifted and extreme inputs are not losses' inputs
    requires_triton=True,
)

_FLCE = dict(
    kernel_names=("liger_cross_entropy_kernel",),
    domain="none",  # the model's own inputs are token ids: there is no floating range to stress
    workloads=("train", "train-ddp"),
    omitted_outputs=("logits",),
    requires_triton=True,
)

FLCE = Patch(
    name="liger-flce",
    description="Liger-Kernel fused linear cross entropy in Llama training: loss without materialising the logits",
    targets=("transformers.models.llama.modeling_llama:LlamaForCausalLM",),
    replacement=LigerFLCELlamaForCausalLM,
    architectures=("llama",),
    **_FLCE,
)

FLCE_GPT2 = Patch(
    name="liger-flce-gpt2",
    description="Liger-Kernel fused linear cross entropy in GPT-2 training: loss without materialising the logits",
    targets=("transformers.models.gpt2.modeling_gpt2:GPT2LMHeadModel",),
    replacement=LigerFLCEGPT2LMHeadModel,
    architectures=("gpt2",),
    **_FLCE,
)
