"""Rogue: returns bf16 where the stock op returns fp32 (half the bytes to write).

GPT-2 casts the probabilities to the value dtype right after, which hides the change from the model; caught by the
output dtype check (output_dtype).
"""

from collections import Counter

import torch
import torch.nn.functional as F

from e2eprof.kernels.fastsoftmax.patch import softmax_reference
from e2eprof.patch import Patch

CALLS = Counter()


def bf16_softmax(input, dim=None, _stacklevel=3, dtype=None):
    CALLS["rogue.fwd"] += 1
    return F.softmax(input, dim=dim, dtype=dtype).to(torch.bfloat16)


PATCH = Patch(name="rogue-wrong-dtype", targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
              replacement=bf16_softmax, reference=softmax_reference, architectures=("gpt2",),
              attn_implementation="eager", implementations=lambda: dict(CALLS))
