"""ArmWorker.release_cached_memory on CUDA: a worker that has stepped holds allocator cache beyond what it has
allocated, and the command gives that cache back without touching the arm's live state (it steps on afterwards).
This is the memory an arm retried alone after running out (runner._overlapped) can then use."""

from __future__ import annotations

import pytest
import torch

from e2eprof.worker import ArmSpec, ArmWorker, WorkerSetup

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_the_cache_goes_back_and_the_arm_steps_on(tmp_path):
    arm = ArmWorker(WorkerSetup(arm=ArmSpec("baseline", "sdpa", False), model="gpt2-tiny", patch_spec="fastsoftmax",
                                device="cuda", precision="fp32", seed=0, batch=4, seq=128, new_tokens=4,
                                scratch_dir=str(tmp_path)))
    arm.build()
    arm.cold("train")
    torch.cuda.synchronize()
    # The step's activations are freed but stay reserved: the cache the command exists to give back.
    cached = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    assert cached > 0
    assert arm.release_cached_memory() == {}
    assert torch.cuda.memory_reserved() - torch.cuda.memory_allocated() < cached
    arm.cold("train")  # weights, optimizer state and batches are untouched
