"""Rogue: one NaN in an output the reference has finite (a tail element a kernel forgot to write).

A check that treats NaN as "close", or skips non-finite values, passes it; caught by NaN/Inf positions against the
stock output (nan_inf_positions) and an infinite relative error.
"""

from collections import Counter

import torch.nn.functional as F

from e2eprof.kernels.fastsoftmax.patch import softmax_reference
from e2eprof.patch import Patch

CALLS = Counter()


def nan_softmax(input, dim=None, _stacklevel=3, dtype=None):
    CALLS["rogue.fwd"] += 1
    out = F.softmax(input, dim=dim, dtype=dtype)
    out.view(-1)[-1] = float("nan")  # the last row's last element: never masked, never zero
    return out


PATCH = Patch(name="rogue-nan", targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
              replacement=nan_softmax, reference=softmax_reference, architectures=("gpt2",),
              attn_implementation="eager", implementations=lambda: dict(CALLS))
