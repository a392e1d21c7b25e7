"""Rogue: right for its first calls, then an "autotuner" switches it to a faster, wrong variant.

Passes the correctness gate before timing; caught by re-checking the patched arm after timing (revalidation).
"""

from collections import Counter

import torch.nn.functional as F

from e2eprof.kernels.fastsoftmax.patch import softmax_reference
from e2eprof.patch import Patch

CALLS = Counter()
# gpt2-tiny (2 layers) infer, one signature: the cold step makes 2 calls and the verified gate 35 (the model's 2 calls,
# each repeated on copies and on new contents, and the signature's neighbouring shapes and stress points, forward and
# backward), so 40 covers the gate; warm-up alone makes at least 12 more. More gate checks mean raising this.
GOOD_CALLS = 40


def degrading_softmax(input, dim=None, _stacklevel=3, dtype=None):
    CALLS["rogue.fwd"] += 1
    out = F.softmax(input, dim=dim, dtype=dtype)
    return out if CALLS["rogue.fwd"] <= GOOD_CALLS else out * 0.9


PATCH = Patch(name="rogue-degrades", targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
              replacement=degrading_softmax, reference=softmax_reference, architectures=("gpt2",),
              attn_implementation="eager", implementations=lambda: dict(CALLS))
