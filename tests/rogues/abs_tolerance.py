"""Rogue: an error of 5e-5 on every probability, inside allclose(atol=1e-4, rtol=1e-4) (KernelBench's fp32 bar).

Softmax outputs are small, so an absolute tolerance hides an error of several percent on the small ones; caught by
the relative-norm error against fp64 (op_rel_error_vs_fp64).
"""

from collections import Counter

import torch.nn.functional as F

from e2eprof.kernels.fastsoftmax.patch import softmax_reference
from e2eprof.patch import Patch

CALLS = Counter()
ERROR = 5e-5


def sloppy_softmax(input, dim=None, _stacklevel=3, dtype=None):
    CALLS["rogue.fwd"] += 1
    return F.softmax(input, dim=dim, dtype=dtype) + ERROR


PATCH = Patch(name="rogue-abs-tolerance", targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
              replacement=sloppy_softmax, reference=softmax_reference, architectures=("gpt2",),
              attn_implementation="eager", implementations=lambda: dict(CALLS))
