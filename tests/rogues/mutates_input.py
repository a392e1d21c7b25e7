"""Rogue: subtracts the row maximum from its input in place (saving a buffer), then softmaxes.

The output is right and GPT-2 never reads the scores again, so every value check passes; caught by comparing the
inputs bit for bit before and after the call (input_mutated).
"""

from collections import Counter

import torch.nn.functional as F

from e2eprof.kernels.fastsoftmax.patch import softmax_reference
from e2eprof.patch import Patch

CALLS = Counter()


def mutating_softmax(input, dim=None, _stacklevel=3, dtype=None):
    CALLS["rogue.fwd"] += 1
    input.data.sub_(input.amax(dim=dim, keepdim=True))
    return F.softmax(input, dim=dim, dtype=dtype)


PATCH = Patch(name="rogue-mutates-input", targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
              replacement=mutating_softmax, reference=softmax_reference, architectures=("gpt2",),
              attn_implementation="eager", implementations=lambda: dict(CALLS))
