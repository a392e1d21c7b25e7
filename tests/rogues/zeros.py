"""Rogue: returns zeros of the right shape and dtype. Caught by the value check (op_rel_error_vs_fp64)."""

from collections import Counter

import torch

from e2eprof.kernels.fastsoftmax.patch import softmax_reference
from e2eprof.patch import Patch

CALLS = Counter()


def zeros_softmax(input, dim=None, _stacklevel=3, dtype=None):
    CALLS["rogue.fwd"] += 1
    return torch.zeros_like(input)


PATCH = Patch(name="rogue-zeros", targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
              replacement=zeros_softmax, reference=softmax_reference, architectures=("gpt2",),
              attn_implementation="eager", implementations=lambda: dict(CALLS))
