"""Rogue: hands "post-processing" to a worker thread it starts on its first call and keeps for good.

The pool starts during the cold step, before any checked call, so the per-call thread count sees nothing; caught
by the threads each timed step leaves running, against the baseline's (step_threads_leaked).
"""

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import torch.nn.functional as F

from e2eprof.kernels.fastsoftmax.patch import softmax_reference
from e2eprof.patch import Patch

CALLS = Counter()
_POOL = None


def pooled_softmax(input, dim=None, _stacklevel=3, dtype=None):
    global _POOL
    CALLS["rogue.fwd"] += 1
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=1)
    _POOL.submit(time.sleep, 0.001)
    return F.softmax(input, dim=dim, dtype=dtype)


PATCH = Patch(name="rogue-thread-pool", targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
              replacement=pooled_softmax, reference=softmax_reference, architectures=("gpt2",),
              attn_implementation="eager", implementations=lambda: dict(CALLS))
