"""Rogue: a softmax that returns zeros for a fully masked row, where the stock op does not.

Some kernels special-case a row with nothing visible (every score -inf, or the dtype's lowest value) and write zeros;
torch's softmax gives NaN for an all -inf row and a uniform row for an all-lowest one, and the model downstream sees
those. A batch without padding never has such a row, so every check on the model's own calls passes. Caught by the
stress check's fully masked rows, and only there.
"""

from collections import Counter

import torch
import torch.nn.functional as F

from e2eprof.kernels.fastsoftmax.patch import softmax_reference
from e2eprof.patch import Patch

CALLS = Counter()
_STOCK = F.softmax


def zeroing_softmax(input, dim=None, _stacklevel=3, dtype=None):
    CALLS["rogue.fwd"] += 1
    out = _STOCK(input, dim=-1 if dim is None else dim, dtype=dtype)
    masked = (input <= torch.finfo(input.dtype).min / 2).all(dim=-1 if dim is None else dim, keepdim=True)
    return out.masked_fill(masked, 0.0)


PATCH = Patch(name="rogue-masked-rows-zeroed", targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
              replacement=zeroing_softmax, reference=softmax_reference, architectures=("gpt2",),
              attn_implementation="eager", implementations=lambda: dict(CALLS), domain="softmax")
