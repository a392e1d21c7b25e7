"""Rogue: returns a tensor of the right shape and dtype on the "meta" device, which holds no values at all.

Nothing is computed, and every later op on it computes nothing either (meta tensors propagate): a step that is
"faster" because it does no work. Caught by the output device check (output_device); it is also the CPU-side
stand-in for an output on the wrong GPU, since the verified call hands the model the stock output either way.
"""

from collections import Counter

import torch

from e2eprof.kernels.fastsoftmax.patch import softmax_reference
from e2eprof.patch import Patch

CALLS = Counter()


def meta_softmax(input, dim=None, _stacklevel=3, dtype=None):
    CALLS["rogue.fwd"] += 1
    return torch.empty_like(input, dtype=dtype or input.dtype, device="meta")


PATCH = Patch(name="rogue-meta-output", targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
              replacement=meta_softmax, reference=softmax_reference, architectures=("gpt2",),
              attn_implementation="eager", implementations=lambda: dict(CALLS))
