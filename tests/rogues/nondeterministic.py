"""Rogue: output changes from call to call (like a kernel reading uninitialised or racing memory).

The wobble is 1e-7 relative, far inside every error tolerance; caught by calling twice on the same inputs and
requiring bit-identical outputs (nondeterministic).
"""

from collections import Counter

import torch
import torch.nn.functional as F

from e2eprof.kernels.fastsoftmax.patch import softmax_reference
from e2eprof.patch import Patch

CALLS = Counter()


def wobbly_softmax(input, dim=None, _stacklevel=3, dtype=None):
    CALLS["rogue.fwd"] += 1
    out = F.softmax(input, dim=dim, dtype=dtype)
    return out * (1 + 1e-7 * torch.randn_like(out))


PATCH = Patch(name="rogue-nondeterministic", targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
              replacement=wobbly_softmax, reference=softmax_reference, architectures=("gpt2",),
              attn_implementation="eager", implementations=lambda: dict(CALLS))
