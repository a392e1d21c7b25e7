"""The fp64 reference falls back to the host when the device runs out (ArmWorker.reference).

A CUDA out-of-memory cannot happen on the CPU, so here the device attempt is made to raise it; what follows is the
real fallback: a model rebuilt on the host from the source and the pristine weights, whose fp64 outputs must be
exactly those of the usual path. The real out-of-memory on CUDA: tests/gpu/test_out_of_memory_cuda.py.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from e2eprof.harness.protocol import ArmSpec, WorkerSetup
from e2eprof.harness.worker import ArmWorker


@pytest.fixture
def arm(tmp_path):
    worker = ArmWorker(WorkerSetup(arm=ArmSpec("baseline", "sdpa", False), model="gpt2-tiny", patch_spec="fastsoftmax",
                                   device="cpu", precision="fp32", seed=0, batch=2, seq=16, new_tokens=4,
                                   scratch_dir=str(tmp_path)))
    worker.build()
    worker.cold("train")  # the arm has trained a step: the reference must still use the pristine weights
    worker.block("train", 0, 2)
    return worker


@pytest.mark.parametrize("workload", ["train", "infer"])
def test_the_host_fallback_gives_the_same_fp64_outputs(arm, tmp_path, workload):
    usual = arm.reference(workload, str(tmp_path / "usual.safetensors"))
    assert usual["device"] == "cpu"  # this arm's own device

    real = arm._fp64_outputs
    attempts = []

    def device_runs_out(workload_name, model64, device):
        attempts.append(device)
        if len(attempts) == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(workload_name, model64, device)

    arm._fp64_outputs = device_runs_out
    fallback = arm.reference(workload, str(tmp_path / "fallback.safetensors"))
    assert len(attempts) == 2 and fallback["device"] == "cpu"
    a, b = load_file(usual["path"]), load_file(fallback["path"])
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == torch.float64
        assert torch.equal(a[key], b[key]), key


def test_the_host_fallback_uses_every_core_then_gives_the_placement_back(arm, tmp_path):
    """A worker's placement leaves it a few threads; the reference it moves to the host runs on all of the host's
    cores (nothing is timed beside it) and the worker's own thread count comes back afterwards."""
    import os

    from e2eprof.harness.isolation import Placement, apply_in_worker, available_cores

    host = len(available_cores())
    if host < 2:
        pytest.skip("one core: nothing to widen")
    saved = torch.get_num_threads()
    real = arm._fp64_outputs
    seen = []

    def device_runs_out(workload_name, model64, device):
        seen.append(torch.get_num_threads())
        if len(seen) == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(workload_name, model64, device)

    arm._fp64_outputs = device_runs_out
    try:
        apply_in_worker(Placement(threads=1))  # as a worker with a one-thread share starts
        arm.reference("train", str(tmp_path / "fallback.safetensors"))
        assert seen == [1, host]
        assert torch.get_num_threads() == 1
        assert set(os.sched_getaffinity(0)) == set(available_cores())
    finally:
        torch.set_num_threads(saved)


def test_without_host_fallback_a_reference_out_of_memory_says_so_and_computes_nothing(arm, tmp_path):
    attempts = []

    def device_runs_out(workload_name, model64, device):
        attempts.append(device)
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    arm._fp64_outputs = device_runs_out
    path = tmp_path / "reference.safetensors"
    assert arm.reference("train", str(path), host_fallback=False) == {"out_of_memory": True}
    assert len(attempts) == 1 and not path.exists()  # no host attempt: the parent makes room and asks again
