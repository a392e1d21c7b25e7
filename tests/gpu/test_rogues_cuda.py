"""The GPU-only rogue (tests/rogues/wrong_device.py): its softmax comes back on the host while the model is on CUDA.

Caught by the output device check through the worker's real verified capture, and through a real compare of
gpt2-tiny, where the model raises on the host tensor in the cold step: the arm fails, and the verified capture
run afterwards (the verified call hands the model the stock output) names output_device in the report.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from e2eprof.cli import main
from e2eprof.checks.correctness import op_check_rows
from e2eprof.patching import call_check_rows
from e2eprof.harness.protocol import ArmSpec, WorkerSetup
from e2eprof.harness.worker import ArmWorker

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

ROGUE = Path(__file__).resolve().parents[1] / "rogues" / "wrong_device.py"


def test_the_verified_call_names_the_device_and_the_capture_finishes(tmp_path):
    arm = ArmWorker(WorkerSetup(arm=ArmSpec("patched", "eager", True), model="gpt2-tiny", patch_spec=str(ROGUE),
                                device="cuda", precision="fp32", seed=0, batch=1, seq=16, new_tokens=4,
                                scratch_dir=str(tmp_path)))
    arm.build()
    try:
        with pytest.raises(RuntimeError):  # the trick is real: unverified, the model cannot use the host tensor
            arm.cold("infer")
        result = arm.capture("infer", str(tmp_path / "capture.safetensors"), verify=True)
    finally:
        arm.revert()
    rows = op_check_rows("infer", "patched", result["op_checks"]) + call_check_rows("infer", "patched", result["op_checks"])
    failed = {r["metric"]: r["detail"] for r in rows if not r["passed"]}
    assert "output_device" in failed and "cpu != stock cuda" in failed["output_device"], failed
    # Its values are right once on the same device: the device is the only problem the value check reports.
    (value,) = [r for r in rows if r["metric"] == "op_rel_error_vs_fp64"]
    assert value["detail"].startswith("device cpu != stock cuda") and "relative error" not in value["detail"], value
    # The model got the stock output back: the captured outputs are finite.
    assert all(bool(torch.isfinite(t).all()) for t in load_file(result["path"]).values())


def test_compare_fails_it_with_output_device(tmp_path):
    out = tmp_path / "report"
    code = main(["compare", "--model", "gpt2-tiny", "--patch", str(ROGUE), "--workload", "infer", "--steps", "6",
                 "--block-steps", "2", "--batch", "1", "--seq", "16", "--dtype", "fp32", "--no-profile",
                 "--reference", "none", "--budget", "0", "--device", "cuda", "--out", str(out)])
    assert code == 1
    summary = pd.read_parquet(out / "summary.parquet")
    patched = summary[summary.arm == "patched"].iloc[0]
    assert patched.verdict == "FAIL" and "INCORRECT" in patched.reasons.split(","), patched.reasons
    checks = pd.read_parquet(out / "correctness.parquet")
    device = checks[(checks.arm == "patched") & (checks.metric == "output_device")]
    assert len(device) == 1 and not device.passed.iloc[0], checks[["metric", "passed", "detail"]].to_string()
    assert "cpu != stock cuda" in device.detail.iloc[0]
    assert pd.read_parquet(out / "run.parquet").status.iloc[0] == "complete"
