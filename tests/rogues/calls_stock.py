"""Rogue: its kernel has a fallback to the stock op, and the fallback is what runs at the model's shapes.

Everything is correct, because it is the stock op; caught by its own kernel counter staying at zero in the patched
arm (custom_kernel_calls -> KERNEL_NOT_RUN).
"""

from collections import Counter

import torch.nn.functional as F

from e2eprof.kernels.fastsoftmax.patch import softmax_reference
from e2eprof.patch import Patch

CALLS = Counter({"rogue.fwd": 0})
MIN_ROW = 65536  # "the kernel only pays off for long rows": longer than any the gate's checks use


def fallback_softmax(input, dim=None, _stacklevel=3, dtype=None):
    if input.shape[-1] >= MIN_ROW:
        CALLS["rogue.fwd"] += 1
        raise NotImplementedError("never reached at the test's shapes")
    return F.softmax(input, dim=dim, dtype=dtype)


PATCH = Patch(name="rogue-calls-stock", targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
              replacement=fallback_softmax, reference=softmax_reference, architectures=("gpt2",),
              attn_implementation="eager", implementations=lambda: dict(CALLS))
