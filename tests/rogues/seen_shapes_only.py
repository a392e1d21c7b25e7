"""Rogue: right only on the row lengths the benchmark uses; its "kernel" assumes a power-of-two row length.

Every row is split into the largest power-of-two block that fits and the tail is never read (the softmax of the
block, zeros after it). GPT-2's attention rows are the sequence length, a power of two in every default, so each of
the model's own calls is exactly right; caught by running the op on neighbouring shapes (unseen_shape).
"""

from collections import Counter

import torch
import torch.nn.functional as F

from e2eprof.kernels.fastsoftmax.patch import softmax_reference
from e2eprof.patch import Patch

CALLS = Counter()


def power_of_two_softmax(input, dim=None, _stacklevel=3, dtype=None):
    CALLS["rogue.fwd"] += 1
    length = input.shape[-1]
    block = 1 << (length.bit_length() - 1)  # the largest power of two <= length
    out = torch.zeros_like(input, dtype=dtype or input.dtype)
    out[..., :block] = F.softmax(input[..., :block], dim=-1, dtype=dtype)
    return out


PATCH = Patch(name="rogue-seen-shapes-only", targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
              replacement=power_of_two_softmax, reference=softmax_reference, architectures=("gpt2",),
              attn_implementation="eager", implementations=lambda: dict(CALLS))
