"""Rogue: returns torch.empty_like (never written), hoping the memory still holds a freed correct result.

Caught because the allocator is poisoned with NaN right before each checked call (nan_inf_positions, value check).
"""

from collections import Counter

import torch

from e2eprof.kernels.fastsoftmax.patch import softmax_reference
from e2eprof.patch import Patch

CALLS = Counter()


def empty_softmax(input, dim=None, _stacklevel=3, dtype=None):
    CALLS["rogue.fwd"] += 1
    return torch.empty_like(input)


PATCH = Patch(name="rogue-empty", targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
              replacement=empty_softmax, reference=softmax_reference, architectures=("gpt2",),
              attn_implementation="eager", implementations=lambda: dict(CALLS))
