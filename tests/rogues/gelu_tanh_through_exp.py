"""Rogue: GPT-2's tanh GELU with tanh written as (exp(2z) - 1) / (exp(2z) + 1).

Algebraically right and exact for the small pre-activations of a random-init model, so every check on the model's
own calls passes. For z above about 44, exp(2z) overflows fp32 and inf / inf gives NaN, where torch's tanh gives 1:
trained models' MLP pre-activations reach that. Caught by the stress check's scaled-up inputs, and only there.
"""

import math
from collections import Counter

import torch
from transformers.activations import NewGELUActivation

from e2eprof.kernels.fastgelu.patch import gelu_reference
from e2eprof.patch import Patch

CALLS = Counter()


class ExpTanhGELU(NewGELUActivation):
    def forward(self, input):
        CALLS["rogue.fwd"] += 1
        z = math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))
        e = torch.exp(2 * z)
        return 0.5 * input * (1.0 + (e - 1) / (e + 1))


PATCH = Patch(name="rogue-gelu-tanh-through-exp", targets=("transformers.activations:NewGELUActivation",),
              replacement=ExpTanhGELU, reference=gelu_reference, architectures=("gpt2",),
              implementations=lambda: dict(CALLS))
