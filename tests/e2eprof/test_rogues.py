"""The rogues' gallery (tests/rogues/): every cheating kernel is caught, and by the check meant for it.

Two levels. Every rogue goes through the worker's real capture path in this process (ArmWorker without the
pipe: build, cold step, verified capture), which is where the per-call checks run; a rogue whose `only` flag is
set must pass every other check, so the test fails if its check is removed. Then one rogue per way a finding
reaches the verdict goes through a real `compare` run of gpt2-tiny (worker processes, report tables, exit code);
E2EPROF_ROGUES_ALL=1 runs the whole gallery that way (about 25 s a rogue on a 2-core CPU).
"""

from __future__ import annotations

import importlib.util
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from e2eprof.cli import main
from e2eprof.checks.correctness import op_check_rows
from e2eprof.patching import CALL_CHECK_METRICS, call_check_rows
from e2eprof.phases.proof import kernel_ran_rows, thread_rows
from e2eprof.harness.protocol import ArmSpec, WorkerSetup
from e2eprof.harness.worker import ArmWorker

pytestmark = pytest.mark.slow

ROGUES = Path(__file__).resolve().parents[1] / "rogues"
VALUE = "op_rel_error_vs_fp64"


@dataclass(frozen=True)
class Rogue:
    file: str
    caught_by: str  # the correctness metric that must fail
    only: bool  # every other per-call check passes: this check alone catches the trick
    needs_cuda: bool = False  # misbehaves only on a GPU: tests/gpu/test_rogues_cuda.py runs it

    def __str__(self) -> str:
        return self.file


GALLERY = [
    Rogue("identity.py", VALUE, False),
    Rogue("zeros.py", VALUE, False),
    Rogue("first_call_only.py", VALUE, False),
    Rogue("abs_tolerance.py", VALUE, False),
    Rogue("low_precision.py", VALUE, False),
    Rogue("empty_output.py", "nan_inf_positions", False),
    Rogue("nan_output.py", "nan_inf_positions", False),
    Rogue("subclass_output.py", "output_not_plain_tensor", False),
    Rogue("wrong_dtype.py", "output_dtype", False),
    Rogue("wrong_strides.py", "output_strides", False),
    Rogue("meta_output.py", "output_device", False),  # the values check fails too: there are none
    Rogue("wrong_device.py", "output_device", False, needs_cuda=True),
    # Not "only": whether the model's own calls or the repeat on copies also hit a cached address depends on where
    # the allocator puts each tensor, so other checks may catch it too (seen in a clean-venv CI run).
    Rogue("stale_cache.py", "stale_output", False),
    Rogue("mutates_input.py", "input_mutated", True),
    Rogue("nondeterministic.py", "nondeterministic", True),
    Rogue("background_thread.py", "threads_leaked", True),
    Rogue("seen_shapes_only.py", "unseen_shape", True),
    # Numerics a random-init model never reaches (e2eprof.checks.stress): one rogue per classic bug, each right on every
    # call the model makes.
    Rogue("softmax_without_max.py", "stress", True),
    Rogue("masked_rows_zeroed.py", "stress", True),
    Rogue("softmax_sums_in_input_dtype.py", "stress", True),
    Rogue("layernorm_one_pass_variance.py", "stress", True),
    Rogue("gelu_tanh_through_exp.py", "stress", True),
    # Caught outside the per-call checks (counters, timed steps, after timing): see the tests below.
    Rogue("calls_stock.py", "custom_kernel_calls", True),
    Rogue("thread_pool.py", "step_threads_leaked", True),
    Rogue("degrades_after_capture.py", "revalidation", True),
]
BY_FILE = {r.file: r for r in GALLERY}
# One rogue per path from a finding to the verdict: per-call rows, kernel counters, timed steps, revalidation.
THROUGH_COMPARE = ["mutates_input.py", "calls_stock.py", "thread_pool.py", "degrades_after_capture.py"]


def test_every_rogue_file_is_in_the_gallery():
    assert {p.name for p in ROGUES.glob("*.py")} == set(BY_FILE)


@pytest.fixture
def worker(tmp_path):
    """The patched arm's worker, in this process; its patch is reverted afterwards."""
    made = []

    def make(file: str) -> ArmWorker:
        arm = ArmWorker(WorkerSetup(arm=ArmSpec("patched", "eager", True), model="gpt2-tiny",
                                    patch_spec=str(ROGUES / file), device="cpu", precision="fp32", seed=0, batch=1,
                                    seq=16, new_tokens=4, scratch_dir=str(tmp_path)))
        made.append(arm)
        arm.build()
        return arm

    yield make
    for arm in made:
        arm.revert()


def checked_rows(arm: ArmWorker, path: Path) -> list[dict]:
    """Correctness rows of one verified capture, as the runner writes them for the patched arm."""
    checks = arm.capture("infer", str(path), verify=True)["op_checks"]
    return op_check_rows("infer", "patched", checks) + call_check_rows("infer", "patched", checks)


def failed(rows: list[dict]) -> set[str]:
    return {r["metric"] for r in rows if not r["passed"]}


def on_cpu(rogue: Rogue):
    """The rogue as a test parameter, skipped with the reason when it needs a GPU to misbehave."""
    skip = pytest.mark.skip("needs a CUDA device to put its output elsewhere: tests/gpu/test_rogues_cuda.py")
    return pytest.param(rogue, id=rogue.file, marks=[skip] if rogue.needs_cuda else [])


@pytest.mark.parametrize("rogue", [on_cpu(r) for r in GALLERY if r.caught_by == VALUE or r.caught_by in CALL_CHECK_METRICS])
def test_per_call_checks_catch_the_rogue(worker, tmp_path, rogue):
    arm = worker(rogue.file)
    arm.cold("infer")
    rows = checked_rows(arm, tmp_path / "capture.safetensors")
    assert rogue.caught_by in failed(rows), rows
    if rogue.only:
        assert failed(rows) == {rogue.caught_by}, "another check caught it too: it does not show this check is needed"


def test_a_genuine_kernel_passes_every_per_call_check(worker, tmp_path):
    arm = worker(str(Path(__file__).resolve().parents[2] / "kernels" / "fastsoftmax" / "patch.py"))
    arm.cold("infer")
    rows = checked_rows(arm, tmp_path / "capture.safetensors")
    assert not failed(rows), [r for r in rows if not r["passed"]]
    assert {r["metric"] for r in rows} >= {"input_mutated", "nondeterministic", "stale_output", "threads_leaked"}


def test_an_unusable_output_is_replaced_by_the_stock_one_so_the_capture_finishes(worker, tmp_path):
    """The model cannot go on with an output on another device: the verified call records output_device and hands
    the model the stock output, so the capture's own outputs are the stock model's, not a crash."""
    arm = worker("meta_output.py")
    result = arm.capture("infer", str(tmp_path / "capture.safetensors"), verify=True)
    (check,) = result["op_checks"]
    assert check["findings"]["output_device"][0] == check["calls"] > 0
    logits = load_file(result["path"])
    assert all(t.device.type == "cpu" and bool(torch.isfinite(t).all()) for t in logits.values())


def test_abs_tolerance_rogue_would_pass_allclose():
    """The trick is real: KernelBench's fp32 allclose accepts what the relative-norm check rejects."""
    spec = importlib.util.spec_from_file_location("rogue_abs", ROGUES / "abs_tolerance.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    scores = torch.randn(2, 4, 16, 16)
    stock = torch.softmax(scores, -1)
    assert torch.allclose(module.sloppy_softmax(scores, dim=-1), stock, atol=1e-4, rtol=1e-4)


def test_fallback_to_the_stock_op_leaves_the_kernel_counter_at_zero(worker, tmp_path):
    arm = worker("calls_stock.py")
    before = {"patched": arm.counters()}
    arm.cold("infer")
    rows = checked_rows(arm, tmp_path / "capture.safetensors")
    assert not failed(rows)  # it is the stock op: every value check passes
    proof = kernel_ran_rows("infer", before, {"patched": arm.counters()})
    assert {r["metric"]: r["passed"] for r in proof} == {"patched_calls": True, "custom_kernel_calls": False}


def test_a_persistent_thread_pool_shows_in_the_timed_steps_not_in_the_calls(worker, tmp_path):
    # This test counts the process's threads: let the background_thread rogue's sleepers from earlier tests end
    # first, or one ending inside the cold step cancels the pool's thread (seen on a loaded machine).
    for thread in threading.enumerate():
        if thread.name.endswith("(sleep)"):
            thread.join(timeout=10)
    arm = worker("thread_pool.py")
    steps = arm.cold("infer")  # the pool starts here, before any checked call
    assert not failed(checked_rows(arm, tmp_path / "capture.safetensors"))
    steps += arm.block("infer", 0, 2)
    (row,) = thread_rows("infer", steps)
    assert row["metric"] == "step_threads_leaked" and not row["passed"] and row["value"] >= 1


def test_a_kernel_that_degrades_after_the_gate_fails_when_checked_again(worker, tmp_path):
    arm = worker("degrades_after_capture.py")
    arm.cold("infer")
    assert not failed(checked_rows(arm, tmp_path / "gate.safetensors"))
    arm.block("infer", 0, 6)  # the timed phase, as the runner runs it
    assert VALUE in failed(checked_rows(arm, tmp_path / "again.safetensors"))


# ---- through a real compare run ------------------------------------------------------------------------------
def compare_rogue(file: str, out: Path) -> int:
    return main(["compare", "--model", "gpt2-tiny", "--patch", str(ROGUES / file), "--workload", "infer",
                 "--steps", "6", "--block-steps", "2", "--batch", "1", "--seq", "16", "--no-profile",
                 "--reference", "none", "--device", "cpu", "--out", str(out)])


@pytest.mark.parametrize("file", [r.file if (r.file in THROUGH_COMPARE or os.environ.get("E2EPROF_ROGUES_ALL"))
                                  and not r.needs_cuda
                                  else pytest.param(r.file, marks=pytest.mark.skip(
                                      "needs a CUDA device: tests/gpu/test_rogues_cuda.py" if r.needs_cuda
                                      else "set E2EPROF_ROGUES_ALL=1"))
                                  for r in GALLERY])
def test_compare_fails_the_rogue(tmp_path, file):
    rogue = BY_FILE[file]
    out = tmp_path / "report"
    assert compare_rogue(file, out) == 1
    summary = pd.read_parquet(out / "summary.parquet")
    patched = summary[summary.arm == "patched"].iloc[0]
    assert patched.verdict == "FAIL"
    expected = "KERNEL_NOT_RUN" if rogue.caught_by == "custom_kernel_calls" else "INCORRECT"
    assert expected in patched.reasons.split(","), patched.reasons
    checks = pd.read_parquet(out / "correctness.parquet")
    mine = checks[(checks.arm == "patched") & (checks.metric == rogue.caught_by)]
    assert len(mine) and not mine.passed.all(), checks[["metric", "passed", "detail"]].to_string()
    assert pd.read_parquet(out / "run.parquet").status.iloc[0] == "complete"
