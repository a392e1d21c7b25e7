"""Rogue: caches results by the input's address, so a reused buffer with new contents gets a stale output.

Correct whenever a tensor arrives at a new address, so the model's own calls can all pass; caught by refilling the
same tensors with new contents (stale_output).
"""

from collections import Counter

import torch.nn.functional as F

from e2eprof.kernels.fastsoftmax.patch import softmax_reference
from e2eprof.patch import Patch

CALLS = Counter()
_CACHE = {}


def cached_softmax(input, dim=None, _stacklevel=3, dtype=None):
    CALLS["rogue.fwd"] += 1
    key = (input.data_ptr(), tuple(input.shape), dim)
    if key not in _CACHE:
        _CACHE[key] = F.softmax(input, dim=dim, dtype=dtype)
    return _CACHE[key]


PATCH = Patch(name="rogue-stale-cache", targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
              replacement=cached_softmax, reference=softmax_reference, architectures=("gpt2",),
              attn_implementation="eager", implementations=lambda: dict(CALLS))
