"""Rogue: computes the softmax on the host and returns it there when its input is on a CUDA device.

The kind of output a half-ported kernel gives (a CPU fallback that forgets to copy back). The model's next op
raises on it, so the verified call records the finding, hands the model the stock output and the report says
output_device instead of only "the arm crashed". Needs a GPU to misbehave: on a CPU-only machine its output is
on the right device (tests/gpu/test_rogues_cuda.py runs it on CUDA).
"""

from collections import Counter

import torch.nn.functional as F

from e2eprof.kernels.fastsoftmax.patch import softmax_reference
from e2eprof.patch import Patch

CALLS = Counter()


def host_softmax(input, dim=None, _stacklevel=3, dtype=None):
    CALLS["rogue.fwd"] += 1
    return F.softmax(input.cpu(), dim=dim, dtype=dtype)


PATCH = Patch(name="rogue-wrong-device", targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
              replacement=host_softmax, reference=softmax_reference, architectures=("gpt2",),
              attn_implementation="eager", implementations=lambda: dict(CALLS))
