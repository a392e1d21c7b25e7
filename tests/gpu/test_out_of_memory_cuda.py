"""Out of memory on CUDA, provoked for real: a worker's allocator cache goes back on request
(ArmWorker.release_cached_memory, what an arm retried alone after running out can then use), and the fp64
reference that does not fit on the device runs on the host instead, without leaving device memory behind."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from e2eprof.harness.protocol import ArmSpec, WorkerSetup
from e2eprof.harness.worker import ArmWorker

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _arm(tmp_path, model: str, batch: int, seq: int) -> ArmWorker:
    arm = ArmWorker(WorkerSetup(arm=ArmSpec("baseline", "sdpa", False), model=model, patch_spec="fastsoftmax",
                                device="cuda", precision="bf16", seed=0, batch=batch, seq=seq, new_tokens=4,
                                scratch_dir=str(tmp_path)))
    arm.build()
    return arm


def test_the_cache_goes_back_and_the_arm_steps_on(tmp_path):
    arm = _arm(tmp_path, "gpt2-tiny", 4, 128)
    arm.cold("train")
    torch.cuda.synchronize()
    # The step's activations are freed but stay reserved: the cache the command exists to give back.
    cached = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    assert cached > 0
    assert arm.release_cached_memory() == {}
    assert torch.cuda.memory_reserved() - torch.cuda.memory_allocated() < cached
    arm.cold("train")  # weights, optimizer state and batches are untouched


def test_a_reference_that_does_not_fit_runs_on_the_host_and_frees_the_device(tmp_path):
    arm = _arm(tmp_path, "gpt2", 2, 128)  # 124M parameters: its fp64 copy alone needs 1 GB
    arm.cold("train")
    torch.cuda.synchronize()
    reserved = torch.cuda.memory_reserved()
    on_device = arm.reference("train", str(tmp_path / "device.safetensors"))
    assert on_device["device"] == "cuda"
    torch.cuda.synchronize()
    # The reference empties the cache after freeing its fp64 model (1 GB here): none of it stays reserved.
    assert torch.cuda.memory_reserved() <= reserved
    torch.cuda.empty_cache()
    allocated = torch.cuda.memory_allocated()
    free, _ = torch.cuda.mem_get_info()
    # Everything but 256 MB of the device taken by another tenant (here: this test): the fp64 copy cannot fit.
    blocker = torch.empty(free - 256 * 2**20, dtype=torch.uint8, device="cuda")
    try:
        on_host = arm.reference("train", str(tmp_path / "host.safetensors"))
        assert on_host["device"] == "cpu"
        torch.cuda.synchronize()
        # The failed device attempt left nothing allocated behind it.
        assert torch.cuda.memory_allocated() - blocker.numel() <= allocated + 2**20
    finally:
        del blocker
    a, b = load_file(on_device["path"]), load_file(on_host["path"])
    assert sorted(a) == sorted(b)
    for key in a:
        # fp64 on two devices is not bitwise the same (other kernels, other summation orders). Measured on the H200
        # (2026-12-03, this model and batch): relative-norm difference 1.7e-9 median, 1.3e-8 largest (ln_f's weight
        # gradient). The tightest correctness floor is 1e-5 (fp32), so no verdict can move by where it ran.
        difference = ((a[key] - b[key]).norm() / a[key].norm().clamp_min(1e-300)).item()
        assert difference < 1e-7, (key, difference)
    arm.cold("train")  # the arm goes on
