"""Rogue: returns, and leaves a thread running to finish "the rest of the work" after the call (off the clock).

Values are right; caught by counting Python threads before and after each checked call (threads_leaked).
"""

import threading
import time
from collections import Counter

import torch.nn.functional as F

from e2eprof.kernels.fastsoftmax.patch import softmax_reference
from e2eprof.patch import Patch

CALLS = Counter()
DEFERRED_SECONDS = 0.5  # long enough to outlive the check right after the call on a loaded machine


def deferring_softmax(input, dim=None, _stacklevel=3, dtype=None):
    CALLS["rogue.fwd"] += 1
    threading.Thread(target=time.sleep, args=(DEFERRED_SECONDS,), daemon=True).start()
    return F.softmax(input, dim=dim, dtype=dtype)


PATCH = Patch(name="rogue-background-thread", targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
              replacement=deferring_softmax, reference=softmax_reference, architectures=("gpt2",),
              attn_implementation="eager", implementations=lambda: dict(CALLS))
