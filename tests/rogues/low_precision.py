"""Rogue: computes in bf16 and returns fp32, the dtype it claims (a quiet precision downgrade).

The dtype is right; caught by the error against fp64 being far beyond k x the stock fp32 path's own error
(op_rel_error_vs_fp64).
"""

from collections import Counter

import torch
import torch.nn.functional as F

from e2eprof.kernels.fastsoftmax.patch import softmax_reference
from e2eprof.patch import Patch

CALLS = Counter()


def bf16_inside_softmax(input, dim=None, _stacklevel=3, dtype=None):
    CALLS["rogue.fwd"] += 1
    return F.softmax(input.to(torch.bfloat16), dim=dim).to(input.dtype)


PATCH = Patch(name="rogue-low-precision", targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
              replacement=bf16_inside_softmax, reference=softmax_reference, architectures=("gpt2",),
              attn_implementation="eager", implementations=lambda: dict(CALLS))
