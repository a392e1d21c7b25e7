"""Rogue: returns a torch.Tensor subclass (the shape of a lazy tensor that computes on first use).

Values are right, so the model is right; caught by requiring a plain torch.Tensor (output_not_plain_tensor).
"""

from collections import Counter

import torch
import torch.nn.functional as F

from e2eprof.kernels.fastsoftmax.patch import softmax_reference
from e2eprof.patch import Patch

CALLS = Counter()


class LazyLookingTensor(torch.Tensor):
    pass


def subclass_softmax(input, dim=None, _stacklevel=3, dtype=None):
    CALLS["rogue.fwd"] += 1
    return F.softmax(input, dim=dim, dtype=dtype).as_subclass(LazyLookingTensor)


PATCH = Patch(name="rogue-subclass", targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
              replacement=subclass_softmax, reference=softmax_reference, architectures=("gpt2",),
              attn_implementation="eager", implementations=lambda: dict(CALLS))
