"""Rogue: LayerNorm with the one-pass variance E[x^2] - E[x]^2.

Exact enough on a random-init model's activations (their rows have means near zero), so every check on the model's
own calls passes. On rows with a large mean, as trained models' residual streams have, the two terms cancel
catastrophically: the variance loses every significant digit or turns negative, and the output is garbage or NaN.
Caught by the stress check's row offsets, and only there.
"""

from collections import Counter

import torch

from e2eprof.kernels.fastlayernorm.patch import layer_norm_reference
from e2eprof.patch import Patch

CALLS = Counter()


class OnePassLayerNorm(torch.nn.LayerNorm):
    def forward(self, input):
        CALLS["rogue.fwd"] += 1
        mean = input.mean(dim=-1, keepdim=True)
        var = (input * input).mean(dim=-1, keepdim=True) - mean * mean
        return (input - mean) * torch.rsqrt(var + self.eps) * self.weight + self.bias


PATCH = Patch(name="rogue-layernorm-one-pass-variance",
              targets=("transformers.models.gpt2.modeling_gpt2:nn.LayerNorm",),
              replacement=OnePassLayerNorm, reference=layer_norm_reference, architectures=("gpt2",),
              implementations=lambda: dict(CALLS))
