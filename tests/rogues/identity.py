"""Rogue: returns its input unchanged (no work at all). Caught by the value check (op_rel_error_vs_fp64)."""

from collections import Counter

from e2eprof.kernels.fastsoftmax.patch import softmax_reference
from e2eprof.patch import Patch

CALLS = Counter()


def identity_softmax(input, dim=None, _stacklevel=3, dtype=None):
    CALLS["rogue.fwd"] += 1
    return input


PATCH = Patch(name="rogue-identity", targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
              replacement=identity_softmax, reference=softmax_reference, architectures=("gpt2",),
              attn_implementation="eager", implementations=lambda: dict(CALLS))
