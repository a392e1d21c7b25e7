"""Data-parallel arms (issue 9): real 2-rank worker groups under torchrun with the gloo backend on tiny models.

Every compare here is a real run through the CLI's entry point: torchrun starts two ranks per arm, DDP or FSDP2
wraps the model, gradients are all-reduced over gloo. The last tests are fast unit tests of the pieces the parent
derives from per-rank rows.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from e2eprof.cli import main
from e2eprof.distributed.merge import merge
from e2eprof.distributed.options import LaunchSpec, check_launch
from e2eprof.distributed.ranks import rank_spread, slowest_rank, slowest_rank_frame
from e2eprof.errors import UsageError

SMALL = ["--nproc", "2", "--device", "cpu", "--steps", "6", "--block-steps", "2", "--batch", "1", "--seq", "16",
         "--reference", "none"]


def compare(tmp_path: Path, *args: str) -> tuple[int, Path]:
    out = tmp_path / "report"
    return main(["compare", *SMALL, *args, "--out", str(out)]), out


def check_two_rank_run(out: Path, workload: str) -> pd.DataFrame:
    """What every healthy 2-rank run must hold; returns the summary."""
    steps = pd.read_parquet(out / "steps.parquet")
    for arm in ("baseline", "patched"):
        for phase in ("cold", "warm"):
            mine = steps[(steps.arm == arm) & (steps.phase == phase)]
            assert set(mine["rank"]) == {0, 1}, (arm, phase)
        # Both ranks ran the same steps: a rank that ran more would have waited for the other's all-reduce forever.
        warm = steps[(steps.arm == arm) & (steps.phase != "cold")]
        assert len(warm[warm["rank"] == 0]) == len(warm[warm["rank"] == 1])
    checks = pd.read_parquet(out / "correctness.parquet")
    agreement = checks[checks.metric == "rank_agreement"]
    assert set(agreement.arm) == {"baseline", "patched"} and agreement.passed.all(), agreement.detail.tolist()
    # The patched arm's all-reduced gradients against the fp64 mean of both ranks' single-process gradients.
    grads = checks[(checks.arm == "patched") & (checks.tensor == "grad/*")]
    assert len(grads) == 1 and grads.passed.all()
    assert checks[(checks.arm == "patched") & (checks.metric == "patched_calls")].value.iloc[0] > 0
    summary = pd.read_parquet(out / "summary.parquet")
    patched = summary[summary.arm == "patched"].iloc[0]
    assert patched.workload == workload and patched.verdict in ("PASS", "FAIL", "INCONCLUSIVE")
    assert patched.correct and "ARM_FAILED" not in patched.reasons.split(",")
    assert (summary.ranks == 2).all() and (summary.rank_spread >= 1).all()
    # Statistics use the slowest rank: one sample per step, not one per rank.
    assert patched.n == 6
    return summary


@pytest.mark.slow
def test_ddp_gpt2_fastsoftmax_two_ranks(tmp_path):
    code, out = compare(tmp_path, "--model", "gpt2-tiny", "--patch", "fastsoftmax", "--workload", "train-ddp")
    assert code in (0, 1, 3)
    summary = check_two_rank_run(out, "train-ddp")
    # The profile sees gloo's all-reduce on both ranks: communication is a real share of the step.
    assert (summary.comm_share > 0).all() and (summary.comm_share < 1).all()
    ops = pd.read_parquet(out / "ops.parquet")
    assert set(ops["rank"]) == {0, 1}
    assert ops.op.str.startswith("c10d::allreduce").any()


@pytest.mark.slow
def test_fsdp_gpt2_fastsoftmax_two_ranks(tmp_path):
    code, out = compare(tmp_path, "--model", "gpt2-tiny", "--patch", "fastsoftmax", "--workload", "train-fsdp",
                        "--no-profile")
    assert code in (0, 1, 3)
    check_two_rank_run(out, "train-fsdp")


@pytest.mark.slow
def test_ddp_llama_rmsnorm_two_ranks(tmp_path):
    code, out = compare(tmp_path, "--model", "llama-tiny", "--patch", "rmsnorm", "--workload", "train-ddp",
                        "--no-profile")
    assert code in (0, 1, 3)
    check_two_rank_run(out, "train-ddp")
    checks = pd.read_parquet(out / "correctness.parquet")
    kernel = checks[(checks.arm == "patched") & (checks.metric == "custom_kernel_calls")]
    assert kernel.passed.all() and kernel.value.iloc[0] > 0


def rank_one_patch(tmp_path: Path, body: str) -> Path:
    """A softmax patch that misbehaves on rank 1 only (rank 0 waits for it in the all-reduce)."""
    path = tmp_path / "rank_one.py"
    path.write_text(textwrap.dedent(f"""
        import os
        import torch.nn.functional as F
        from e2eprof.kernels.fastsoftmax.patch import softmax_reference
        from e2eprof.patch import Patch

        def rank_one_softmax(input, dim=None, _stacklevel=3, dtype=None):
            if os.environ.get("RANK") == "1":
                {body}
            return F.softmax(input, dim=dim, dtype=dtype)

        PATCH = Patch(name="rank_one", targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
                      replacement=rank_one_softmax, reference=softmax_reference, architectures=("gpt2",),
                      attn_implementation="eager")
    """))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("body, detail", [("os._exit(7)", "crashed: rank 1 exited with code 7"),
                                          ('raise RuntimeError("kernel launch failed")',
                                           "RuntimeError: kernel launch failed (rank 1)")])
def test_a_failing_rank_fails_the_arm_and_keeps_the_baseline(tmp_path, body, detail):
    code, out = compare(tmp_path, "--model", "gpt2-tiny", "--patch", str(rank_one_patch(tmp_path, body)),
                        "--workload", "train-ddp", "--no-profile")
    assert code == 1
    summary = pd.read_parquet(out / "summary.parquet")
    patched = summary[summary.arm == "patched"].iloc[0]
    assert patched.verdict == "FAIL" and "ARM_FAILED" in patched.reasons.split(",")
    checks = pd.read_parquet(out / "correctness.parquet")
    failure = checks[(checks.arm == "patched") & (checks.metric == "arm_failed")]
    assert len(failure) == 1 and detail in failure.detail.iloc[0], failure.detail.iloc[0]
    steps = pd.read_parquet(out / "steps.parquet")
    baseline = steps[(steps.arm == "baseline") & (steps.phase == "warm")]
    assert len(baseline) == 12 and set(baseline["rank"]) == {0, 1}, "the baseline group must go on alone"
    assert pd.read_parquet(out / "run.parquet").status.iloc[0] == "complete"


def _children(pid: int) -> set[int]:
    """Every live descendant of `pid`, from /proc (Linux)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rpartition(")")[2].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def _timed_on_both_ranks(path: Path) -> bool:
    try:
        steps = pd.read_parquet(path)  # written whole and renamed into place: never half a file
    except OSError:
        return False
    return "rank" in steps and set(steps["rank"]) == {0, 1}


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; the death signal is Linux's")
def test_worker_groups_die_with_a_killed_parent(tmp_path):
    out = tmp_path / "report"
    parent = subprocess.Popen([sys.executable, "-m", "e2eprof", "compare", *SMALL, "--model", "gpt2-tiny",
                               "--patch", "fastsoftmax", "--workload", "train-ddp", "--steps", "400", "--no-profile",
                               "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not _timed_on_both_ranks(out / "steps.parquet"):
            time.sleep(0.5)
        group = _children(parent.pid)
        # Two torchrun agents with two ranks each (plus what they spawn): the groups are running.
        assert len(group) >= 6, group
    finally:
        parent.send_signal(signal.SIGKILL)  # no cleanup runs in the parent: only the death signals remain
        parent.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(_alive(p) for p in group):
        time.sleep(0.5)
    left = [p for p in group if _alive(p)]
    for pid in left:  # do not leave them to other tests, but fail
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes outlived their parent: {left}"


def test_nproc_on_cuda_without_the_gpus_is_a_one_line_usage_error(capsys):
    code = main(["compare", "--model", "gpt2-tiny", "--workload", "train-ddp", "--nproc", "2", "--device", "cuda"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cuda" in err.lower() and "Traceback" not in err


def test_nproc_needs_as_many_gpus(monkeypatch):
    import torch

    # One visible GPU: the case a CPU-only test machine cannot have for real; the check must refuse before launching.
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(UsageError, match=r"--nproc: 2 ranks need 2 GPUs on this machine, 1 visible"):
        check_launch(workloads=("train-ddp",), device="cuda", nproc=2, nnodes=1, rdzv_endpoint=None, find_max_batch=False)


@pytest.mark.parametrize("args, message", [
    (["--workload", "train", "--nproc", "2"], "single-process workload"),
    (["--workload", "train-ddp,train-fsdp", "--nproc", "2"], "one at a time"),
    (["--workload", "train-ddp", "--nproc", "0"], "--nproc: must be an integer >= 1"),
    (["--workload", "train-ddp", "--nnodes", "2"], "needs --rdzv-endpoint"),
    (["--workload", "train-ddp", "--rdzv-endpoint", "nohost"], "expected HOST:PORT"),
    (["--workload", "train-ddp", "--find-max-batch"], "--find-max-batch"),
])
def test_bad_data_parallel_options_exit_2(capsys, args, message):
    assert main(["compare", "--model", "gpt2-tiny", "--device", "cpu", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_torchrun_args_give_each_arm_its_own_rendezvous():
    assert LaunchSpec(2).torchrun_args(1) == ["--standalone", "--nproc-per-node", "2"]
    spec = LaunchSpec(4, nnodes=2, rdzv_endpoint="node0:29500")
    assert spec.torchrun_args(0)[-4:] == ["--master-addr", "node0", "--master-port", "29500"]
    assert spec.torchrun_args(2)[-1] == "29502"
    assert spec.world_size == 8


def _step(rank, step, wall, arm="patched", phase="warm"):
    return {"workload": "train-ddp", "arm": arm, "phase": phase, "block": 0, "step": step, "rank": rank, "wall_ns": wall}


def test_slowest_rank_sets_each_steps_time():
    rows = [_step(0, 0, 10), _step(1, 0, 12), _step(0, 1, 15), _step(1, 1, 11), _step(0, 0, 5, arm="baseline")]
    kept = slowest_rank(rows)
    assert [(r["arm"], r["step"], r["rank"], r["wall_ns"]) for r in kept] == [
        ("patched", 0, 1, 12), ("patched", 1, 0, 15), ("baseline", 0, 0, 5)]
    frame = slowest_rank_frame(pd.DataFrame(rows))
    assert sorted(frame.wall_ns) == [5, 12, 15]
    single = [_step(0, i, 10 + i) for i in range(3)]
    assert slowest_rank(single) == single  # one rank: nothing changes


def test_rank_spread_is_the_ratio_of_rank_medians():
    rows = [_step(0, i, 100) for i in range(3)] + [_step(1, i, 150) for i in range(3)] + [_step(1, 9, 999, phase="cold")]
    assert rank_spread(rows, "train-ddp", "patched") == {"ranks": 2, "rank_spread": 1.5, "slowest_rank": 1}


def test_merged_counters_must_hold_on_every_rank():
    answers = [{"arm": "patched", "wrapper_calls": 8, "signatures": {}, "implementations": {"cpu.fwd": 8}},
               {"arm": "patched", "wrapper_calls": 0, "signatures": {}, "implementations": {"cpu.fwd": 0}}]
    # Patched: a rank that never called the kernel means the kernel did not run everywhere.
    assert merge("counters", answers, patched=True)["wrapper_calls"] == 0
    # Stock: any rank that called it contaminates the arm.
    assert merge("counters", answers, patched=False)["implementations"] == {"cpu.fwd": 8}
    rows = merge("block", [[{"step": 0, "rank": 0}], [{"step": 0, "rank": 1}]], patched=True)
    assert [r["rank"] for r in rows] == [0, 1]


TORCHRUN_REPORT = """
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
e2eprof.distributed.rank FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-02_16:32:41
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 905)
  error_file: <N/A>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-02_16:32:41
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 7 (pid: 906)
  error_file: <N/A>
============================================================
"""


def test_failed_ranks_read_from_torchruns_report(tmp_path):
    from e2eprof.distributed.launch import _failed_ranks

    log = tmp_path / "torchrun.log"
    log.write_text("rank 0 said: ...\n" + TORCHRUN_REPORT)
    assert _failed_ranks(log) == [(1, 7), (0, 1)]
    log.write_text("no failure here\n")
    assert _failed_ranks(log) == []
    assert _failed_ranks(tmp_path / "missing.log") == []


def test_nccl_runs_with_nvlink_multicast_off_unless_the_user_says(monkeypatch, tmp_path):
    from e2eprof.distributed import ENV_BACKEND
    from e2eprof.distributed.launch import launch_env

    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    env = launch_env("cuda", ("127.0.0.1", 1234), b"k", tmp_path)
    assert env["NCCL_NVLS_ENABLE"] == "0" and env[ENV_BACKEND] == "nccl"
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    assert launch_env("cuda", ("127.0.0.1", 1234), b"k", tmp_path)["NCCL_NVLS_ENABLE"] == "1"
    cpu = launch_env("cpu", ("127.0.0.1", 1234), b"k", tmp_path)
    assert cpu[ENV_BACKEND] == "gloo"


@pytest.mark.parametrize("change", ["nan on rank 0 only", "nan on rank 1 only", "extra gradient on rank 1", "same"])
def test_rank_agreement_sees_nan_positions_and_gradients_only_one_rank_has(tmp_path, change):
    import torch
    from safetensors.torch import save_file

    from e2eprof.distributed.ranks import rank_agreement_rows

    rank0 = {"grad/w": torch.tensor([1.0, float("nan"), 3.0]), "loss": torch.tensor(1.0)}
    rank1 = {k: v.clone() for k, v in rank0.items()}
    if change == "nan on rank 0 only":
        rank1["grad/w"][1] = 2.0  # the finite entries agree: only the NaN's position tells them apart
    elif change == "nan on rank 1 only":
        rank1["grad/w"][0] = float("nan")
    elif change == "extra gradient on rank 1":
        rank1["grad/b"] = torch.ones(2)
    paths = [str(tmp_path / "r0.safetensors"), str(tmp_path / "r1.safetensors")]
    save_file(rank0, paths[0])
    save_file(rank1, paths[1])
    (row,) = rank_agreement_rows("train-ddp", "patched", {"rank_paths": paths}, tolerance=1e-6)
    assert row["passed"] == (change == "same"), row
