"""Rogue: softmax as exp(x) / sum(exp(x)), without subtracting the row's maximum first.

Exact on a random-init model's attention scores (they sit near zero), so every check on the model's own calls
passes; a trained model's logits in the tens to hundreds overflow exp in fp32 (exp(89) = inf) and the rows turn to
NaN. Caught by the gate's stress check (scaled-up inputs), and only there.
"""

from collections import Counter

import torch

from e2eprof.kernels.fastsoftmax.patch import softmax_reference
from e2eprof.patch import Patch

CALLS = Counter()


def naive_softmax(input, dim=None, _stacklevel=3, dtype=None):
    CALLS["rogue.fwd"] += 1
    x = input.to(dtype) if dtype is not None else input
    e = torch.exp(x)
    return e / e.sum(dim=-1 if dim is None else dim, keepdim=True)


PATCH = Patch(name="rogue-softmax-without-max", targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
              replacement=naive_softmax, reference=softmax_reference, architectures=("gpt2",),
              attn_implementation="eager", implementations=lambda: dict(CALLS), domain="softmax")
