"""Rogue: returns the right values in column-major layout (a kernel that writes transposed tiles).

Values and the model are right; caught by the output strides check (output_strides): later ops written for the
stock layout may read such a tensor wrongly or slowly.
"""

from collections import Counter

import torch.nn.functional as F

from e2eprof.kernels.fastsoftmax.patch import softmax_reference
from e2eprof.patch import Patch

CALLS = Counter()


def transposed_softmax(input, dim=None, _stacklevel=3, dtype=None):
    CALLS["rogue.fwd"] += 1
    return F.softmax(input, dim=dim, dtype=dtype).transpose(-1, -2).contiguous().transpose(-1, -2)


PATCH = Patch(name="rogue-wrong-strides", targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
              replacement=transposed_softmax, reference=softmax_reference, architectures=("gpt2",),
              attn_implementation="eager", implementations=lambda: dict(CALLS))
