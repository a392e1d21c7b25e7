"""Rogue: a softmax that adds up each row in the input's own dtype, a chunk at a time.

In fp32 that is as good as torch's sum, so a model run in fp32 (the CPU tests) never shows it. In bf16 the running
sum keeps 8 bits: once it reaches a few hundred, each further chunk is rounded by whole units, and a long row's
probabilities drift by percents. Caught by the stress check's long bf16 rows, and only there.
"""

from collections import Counter

import torch

from e2eprof.kernels.fastsoftmax.patch import softmax_reference
from e2eprof.patch import Patch

CALLS = Counter()
CHUNK = 64


def input_dtype_sum_softmax(input, dim=None, _stacklevel=3, dtype=None):
    CALLS["rogue.fwd"] += 1
    dim = -1 if dim is None else dim
    x = input.transpose(dim, -1)
    e = torch.exp(x.float() - x.float().amax(dim=-1, keepdim=True).detach())
    total = torch.zeros(e.shape[:-1] + (1,), dtype=input.dtype, device=input.device)
    for start in range(0, e.shape[-1], CHUNK):  # the running sum, in the input's dtype
        total = total + e[..., start:start + CHUNK].sum(dim=-1, keepdim=True).to(input.dtype)
    out = (e / total.float()).to(dtype or input.dtype)
    return out.transpose(dim, -1)


PATCH = Patch(name="rogue-softmax-sums-in-input-dtype",
              targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
              replacement=input_dtype_sum_softmax, reference=softmax_reference, architectures=("gpt2",),
              attn_implementation="eager", implementations=lambda: dict(CALLS), domain="softmax")
