"""The gate's numeric-range checks on the GPU, in bf16 autocast as the default compare runs them: the built-in
kernels pass the stress points and the trained-like capture at real model widths, and each stress rogue is caught.

The CPU suite runs the same checks in fp32 with Triton interpreted (tests/e2eprof/test_rogues.py,
tests/workloads/test_trained_like.py); compiled Triton kernels in bf16 on the device are what ship.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from e2eprof.checks.correctness import op_check_rows
from e2eprof.patching import call_check_rows
from e2eprof.harness.protocol import ArmSpec, WorkerSetup
from e2eprof.harness.worker import ArmWorker

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

ROGUES = Path(__file__).resolve().parents[1] / "rogues"
BUILT_IN = [("fastsoftmax", "gpt2"), ("fusedsoftmax", "gpt2"), ("fastgelu", "gpt2"), ("fastlayernorm", "gpt2"),
            ("rmsnorm", "llama-1b"), ("swiglu", "llama-1b")]
STRESS_ROGUES = ["softmax_without_max.py", "masked_rows_zeroed.py", "softmax_sums_in_input_dtype.py",
                 "layernorm_one_pass_variance.py", "gelu_tanh_through_exp.py"]


def patched_arm(tmp_path, model: str, patch: str) -> ArmWorker:
    arm = ArmWorker(WorkerSetup(arm=ArmSpec("patched", "eager", True), model=model, patch_spec=patch, device="cuda",
                                precision="bf16", seed=0, batch=2, seq=128, new_tokens=4, scratch_dir=str(tmp_path)))
    arm.build()
    return arm


def rows_of(workload: str, checks: list[dict]) -> list[dict]:
    return op_check_rows(workload, "patched", checks) + call_check_rows(workload, "patched", checks)


@pytest.mark.parametrize("patch, model", BUILT_IN, ids=[p for p, _ in BUILT_IN])
def test_built_in_kernels_pass_the_stress_points_and_the_trained_like_capture(tmp_path, patch, model):
    arm = patched_arm(tmp_path, model, patch)
    try:
        arm.cold("train")
        gate = arm.capture("train", str(tmp_path / "capture.safetensors"), verify=True)["op_checks"]
        trained = arm.trained_like("train")["op_checks"]
    finally:
        arm.revert()
    assert sum(c["stress_points"] for c in gate) > 0, "no stress point ran"
    assert trained and sum(c["calls"] for c in trained) > 0, "the trained-like capture did not call the kernel"
    failed = [(r["metric"], r["detail"]) for r in rows_of("train", gate) + rows_of("train", trained) if not r["passed"]]
    assert not failed, failed


@pytest.mark.parametrize("rogue", STRESS_ROGUES)
def test_stress_rogues_are_caught_in_bf16(tmp_path, rogue):
    arm = patched_arm(tmp_path, "gpt2", str(ROGUES / rogue))
    try:
        arm.cold("infer")
        gate = arm.capture("infer", str(tmp_path / "capture.safetensors"), verify=True)["op_checks"]
    finally:
        arm.revert()
    failed = {r["metric"] for r in rows_of("infer", gate) if not r["passed"]}
    assert "stress" in failed, failed
