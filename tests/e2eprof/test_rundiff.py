"""`diff`: synthetic report directories with known shifts, the committed H200 runs, and the real CLI entry point.

Synthetic runs hold lognormal step times (1% spread, 40 timed steps per arm in blocks of 5, as on the H200) plus
slow cold and warm-up steps that must never count.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from e2eprof.tables import reports
from e2eprof.render import rundiff
from e2eprof.analysis import stats
from e2eprof.config import DeviceDefaults
from e2eprof.errors import UsageError
from e2eprof.render.rundiff import (
    BELOW_MARGIN,
    FASTER,
    NO_SIGNIFICANT_DIFFERENCE,
    ONLY_IN_A,
    ONLY_IN_B,
    OUT_OF_MEMORY_IN_A,
    OUT_OF_MEMORY_IN_B,
    SLOWER,
    SPEEDUP_DROPPED,
    SPEEDUP_GREW,
    DiffConfig,
    diff_runs,
    outcome,
)
from e2eprof.sweep import SweepPoint

REPO = Path(__file__).resolve().parents[2]
H200_FIRST = REPO / "tests" / "data" / "h200-runs" / "2026-12-02-h200-gpt2-fastsoftmax-first"
H200_PROFILED = REPO / "tests" / "data" / "h200-runs" / "2026-12-02-h200-gpt2-fastsoftmax-profiled"

# Medians in ms of a small GPU-like run: the patched kernel is 4% faster than baseline in train.
MEDIANS = {("train", "baseline"): 93.6, ("train", "patched"): 90.0, ("train", "sdpa"): 61.7,
           ("infer", "baseline"): 34.6, ("infer", "patched"): 34.5, ("infer", "sdpa"): 20.1}
CONFIG = {"model": "gpt2", "patch": "fastsoftmax", "batch": 8, "seq": 1024, "precision": "bf16", "new_tokens": 32,
          "device": "cuda", "steps": 40, "block_steps": 5, "seed": 0, "reference_arms": ["sdpa"], "confidence": 0.95,
          "workloads": ["train", "infer"]}
ENVIRONMENT = {"torch": "2.11.0+cu130", "transformers": "5.17.0", "triton": "3.6.0", "driver": "580.159.04",
               "gpu_name": "NVIDIA H200", "gpu_uuid": "2f6a1e3d", "python": "3.12.3", "env_vars": {}}


def write_run(path: Path, *, seed: int, scale: dict | None = None, device_scale: dict | None = None,
              config: dict | None = None, environment: dict | None = None, medians: dict | None = None,
              cv: float = 0.01, n: int = 40, warmup_factor: float = 3.0, sha: str = "65b52ab5" * 8) -> Path:
    """A report directory as `compare` writes it: run.parquet and steps.parquet.

    scale multiplies the wall time of (workload, arm) keys; device_scale the device time only. Each arm gets
    `n` warm steps, one cold step 10x slower and 20 warm-up steps `warmup_factor` x slower.
    """
    rng = np.random.default_rng(seed)
    scale, device_scale = scale or {}, device_scale or {}
    steps = []
    for (workload, arm), median in (medians or MEDIANS).items():
        wall = median * scale.get((workload, arm), 1.0) * rng.lognormal(0.0, cv, n)  # (n,) ms
        device = median * 0.95 * device_scale.get((workload, arm), 1.0) * rng.lognormal(0.0, cv, n)
        phases = [("cold", median * 10, median * 10, 0)] + [("warmup", median * warmup_factor, median, 0)] * 20
        phases += [("warm", w, d, i // 5) for i, (w, d) in enumerate(zip(wall, device))]
        for step, (phase, wall_ms, device_ms, block) in enumerate(phases):
            steps.append({"run_id": path.name, "workload": workload, "arm": arm, "block": block, "step": step,
                          "phase": phase, "wall_ns": int(wall_ms * 1e6), "device_ms": device_ms,
                          "start_unix_ns": 0, "end_unix_ns": 0, "ttft_ms": np.nan, "tpot_ms": np.nan})
    run = {"run_id": path.name, "schema_version": 1, "status": "complete", "command_line": "e2eprof compare",
           "config_json": json.dumps(CONFIG | (config or {})), "environment_json": json.dumps(ENVIRONMENT | (environment or {})),
           "patch_spec": "fastsoftmax", "patch_origin": "builtin", "patch_source_sha256": sha, "seed": 0,
           "batch_digest": "988eeeca", "started_unix_ns": 0, "ended_unix_ns": 1,
           "model_json": json.dumps({"architecture": "gpt2", "n_layer": 12, "n_params": 124439808, "vocab_size": 50257})}
    reports.write_table(path, "run", [run])
    reports.write_table(path, "steps", steps)
    return path


def rows_by_key(result, kind: str) -> dict:
    frame = result.rows[result.rows.kind == kind]
    return {(r.workload, r.arm): r for r in frame.itertuples()}


def run_diff(tmp_path, a, b, **options):
    return diff_runs(DiffConfig(a, b, out=tmp_path / "diff", **options))


# ----------------------------------------------------------------------------------------------------------------
# known shifts


def test_identical_distributions_show_no_difference(tmp_path):
    # A's warm-up steps are 3x slower: if they leaked into the statistics every arm would look slower in A.
    a = write_run(tmp_path / "a", seed=1, warmup_factor=3.0)
    b = write_run(tmp_path / "b", seed=2, warmup_factor=1.0)
    result = run_diff(tmp_path, a, b)
    arms = rows_by_key(result, "arm")
    assert set(arms) == set(MEDIANS)
    assert {r.status for r in arms.values()} == {NO_SIGNIFICANT_DIFFERENCE}
    for r in arms.values():
        assert r.n_a == r.n_b == 40
        assert r.ci_low < 1 < r.ci_high and abs(r.ratio - 1) < 0.01
    speedups = rows_by_key(result, "speedup")
    assert {r.status for r in speedups.values()} == {NO_SIGNIFICANT_DIFFERENCE}
    assert result.exit_code == 0
    assert result.changes == [] and result.flags == []


def test_five_percent_slower_in_b_is_slower_and_exit_1(tmp_path):
    a = write_run(tmp_path / "a", seed=1)
    b = write_run(tmp_path / "b", seed=2, scale={("train", "patched"): 1.05})
    result = run_diff(tmp_path, a, b)
    arms = rows_by_key(result, "arm")
    slow = arms[("train", "patched")]
    assert slow.status == SLOWER
    assert 1.03 < slow.ci_low < 1.05 < slow.ci_high < 1.07
    assert slow.p_adjusted < 1e-6
    assert {r.status for k, r in arms.items() if k != ("train", "patched")} == {NO_SIGNIFICANT_DIFFERENCE}
    # The kernel's train speedup falls from ~1.04x to ~0.99x; infer's is untouched.
    speedups = rows_by_key(result, "speedup")
    train = speedups[("train", "patched")]
    assert train.status == SPEEDUP_DROPPED
    assert train.speedup_a == pytest.approx(93.6 / 90.0, rel=0.01)
    assert train.speedup_b == pytest.approx(93.6 / (90.0 * 1.05), rel=0.01)
    assert train.diff_high < -0.01
    assert speedups[("infer", "patched")].status == NO_SIGNIFICANT_DIFFERENCE
    assert result.exit_code == 1


def test_five_percent_faster_in_b_is_faster_and_exit_0(tmp_path):
    a = write_run(tmp_path / "a", seed=1)
    b = write_run(tmp_path / "b", seed=2, scale={("train", "patched"): 0.95, ("infer", "patched"): 0.95})
    result = run_diff(tmp_path, a, b)
    arms = rows_by_key(result, "arm")
    assert arms[("train", "patched")].status == FASTER and arms[("infer", "patched")].status == FASTER
    assert arms[("train", "patched")].ci_high < 0.97
    speedups = rows_by_key(result, "speedup")
    assert {r.status for r in speedups.values()} == {SPEEDUP_GREW}
    assert result.exit_code == 0


def test_significant_change_under_the_margin_is_below_margin(tmp_path):
    # 0.5% slower with 0.1% noise: certain, but inside --min-change 0.01; with a zero margin it counts.
    # Runs made with --process-noise 0: nothing but the steps' own spread (the next test has the default).
    quiet = {"process_noise": 0.0}
    a = write_run(tmp_path / "a", seed=1, cv=0.001, config=quiet)
    b = write_run(tmp_path / "b", seed=2, cv=0.001, scale={("train", "baseline"): 1.005}, config=quiet)
    result = run_diff(tmp_path, a, b)
    row = rows_by_key(result, "arm")[("train", "baseline")]
    assert row.status == BELOW_MARGIN and row.ci_low > 1.0
    assert result.exit_code == 0
    strict = diff_runs(DiffConfig(a, b, out=tmp_path / "strict", min_change=0.0))
    assert rows_by_key(strict, "arm")[("train", "baseline")].status == SLOWER
    assert strict.exit_code == 1


def test_process_offsets_between_runs_are_not_changes(tmp_path):
    """Two runs are other processes: a shift within their process noise is not a change, one beyond it still is."""
    # 0.5% slower with 0.1% step noise: certain within the steps, but two GPU processes (0.44% apart, the H200's
    # A/A spread) differ that much with no change at all; a run from before process noise gets its device default.
    a = write_run(tmp_path / "a", seed=1, cv=0.001)
    b = write_run(tmp_path / "b", seed=2, cv=0.001, scale={("train", "baseline"): 1.005, ("infer", "baseline"): 1.03})
    result = diff_runs(DiffConfig(a, b, out=tmp_path / "diff", min_change=0.0))
    arms = rows_by_key(result, "arm")
    small, large = arms[("train", "baseline")], arms[("infer", "baseline")]
    assert small.process_noise == pytest.approx(DeviceDefaults.for_device("cuda").process_noise)
    assert small.status == NO_SIGNIFICANT_DIFFERENCE and small.ci_low < 1 < small.ci_high
    assert large.status == SLOWER and large.ci_low > 1.015
    # The kernel's train speedup moved by ~0.5 points in B: inside both runs' process noise, so no change either.
    assert rows_by_key(result, "speedup")[("train", "patched")].status == NO_SIGNIFICANT_DIFFERENCE


def test_pooled_process_noise_pools_replicas():
    """One process per arm in each run gives the run's own figure; replicas divide each run's share."""
    assert stats.pooled_process_noise(0.0044, 1, 0.0044, 1) == pytest.approx(0.0044)
    assert stats.pooled_process_noise(0.0044, 2, 0.0044, 2) == pytest.approx(stats.replicated_process_noise(0.0044, 2, 2))
    assert stats.pooled_process_noise(0.0, 1, 0.0, 1) == 0.0
    assert stats.pooled_process_noise(0.0044, 2, 0.0, 1) == pytest.approx(0.0044 / 2)


def test_replicas_counted_per_arm(tmp_path):
    a = write_run(tmp_path / "a", seed=1)
    steps = reports.read_table(a, "steps")
    replica = (steps.arm == "baseline") & (steps.step % 2 == 1)  # half the baseline's steps from a second process
    reports.write_table(a, "steps", steps.assign(replica=np.where(replica, 1, 0)))
    run = rundiff.load_run(a, "A")
    point = run.points[0]
    assert run.processes(point, "train", "baseline") == 2 and run.processes(point, "train", "patched") == 1


def test_device_metric_reads_device_time(tmp_path):
    a = write_run(tmp_path / "a", seed=1)
    b = write_run(tmp_path / "b", seed=2, device_scale={("infer", "sdpa"): 1.05})
    assert rows_by_key(run_diff(tmp_path, a, b), "arm")[("infer", "sdpa")].status == NO_SIGNIFICANT_DIFFERENCE
    device = diff_runs(DiffConfig(a, b, out=tmp_path / "device", metric="device"))
    row = rows_by_key(device, "arm")[("infer", "sdpa")]
    assert row.status == SLOWER and row.median_b_ms / row.median_a_ms == pytest.approx(1.05, rel=0.01)
    assert device.exit_code == 1


def test_device_metric_without_device_times_is_usage_error(tmp_path):
    a = write_run(tmp_path / "a", seed=1)
    b = write_run(tmp_path / "b", seed=2)
    steps = reports.read_table(b, "steps")
    reports.write_table(b, "steps", steps.assign(device_ms=np.nan))  # what a CPU run records
    with pytest.raises(UsageError, match="--metric device"):
        diff_runs(DiffConfig(a, b, out=tmp_path / "diff", metric="device"))


# ----------------------------------------------------------------------------------------------------------------
# same comparison, changes and flags


def test_different_comparison_is_refused_naming_the_fields(tmp_path):
    a = write_run(tmp_path / "a", seed=1)
    b = write_run(tmp_path / "b", seed=2, config={"batch": 4, "precision": "fp16"})
    with pytest.raises(UsageError) as error:
        run_diff(tmp_path, a, b)
    message = str(error.value)
    assert "batch: 8 vs 4" in message and "dtype: bf16 vs fp16" in message and "--allow-different" in message
    assert "seq" not in message and "model" not in message
    assert not (tmp_path / "diff").exists()
    allowed = run_diff(tmp_path, a, b, allow_different=True)
    assert "DIFFERENT_COMPARISON: batch: 8 vs 4" in allowed.flags


def test_new_tokens_matters_only_when_both_runs_generate(tmp_path):
    a = write_run(tmp_path / "a", seed=1)
    b = write_run(tmp_path / "b", seed=2, config={"new_tokens": 8})
    assert run_diff(tmp_path, a, b).exit_code == 0  # no generate workload: new_tokens shaped nothing
    generate = {("generate", "baseline"): 388.0, ("generate", "patched"): 495.0}
    a = write_run(tmp_path / "ga", seed=1, medians=generate)
    b = write_run(tmp_path / "gb", seed=2, medians=generate, config={"new_tokens": 8})
    with pytest.raises(UsageError, match="new_tokens: 32 vs 8"):
        run_diff(tmp_path, a, b)


def test_environment_changes_are_listed(tmp_path):
    a = write_run(tmp_path / "a", seed=1)
    b = write_run(tmp_path / "b", seed=2, sha="ab" * 32, config={"steps": 20},
                  environment={"torch": "2.12.0+cu130", "driver": "590.1", "env_vars": {"OMP_NUM_THREADS": "4"}})
    changes = run_diff(tmp_path, a, b).changes
    assert "torch: 2.11.0+cu130 -> 2.12.0+cu130" in changes
    assert "driver: 580.159.04 -> 590.1" in changes
    assert "env OMP_NUM_THREADS: unset -> 4" in changes
    assert "patch source sha256: 65b52ab565b5 -> abababababab" in changes
    assert "steps: 40 -> 20" in changes
    assert not any(c.startswith(("triton", "GPU", "transformers")) for c in changes)


def test_workload_in_one_run_only_is_flagged_not_fatal(tmp_path):
    a = write_run(tmp_path / "a", seed=1)
    infer_only = {k: v for k, v in MEDIANS.items() if k[0] == "infer"}
    b = write_run(tmp_path / "b", seed=2, medians=infer_only, config={"workloads": ["infer"]})
    result = run_diff(tmp_path, a, b)
    assert f"{ONLY_IN_A}: workload 'train' was run only in A" in result.flags
    arms = rows_by_key(result, "arm")
    assert {arms[("train", arm)].status for arm in ("baseline", "patched", "sdpa")} == {ONLY_IN_A}
    assert set(rows_by_key(result, "speedup")) == {("infer", "patched")}
    assert result.exit_code == 0


def test_not_a_report_directory(tmp_path):
    b = write_run(tmp_path / "b", seed=2)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="RUN_A: .* is not an e2eprof report directory"):
        diff_runs(DiffConfig(tmp_path / "empty", b))
    with pytest.raises(UsageError, match="RUN_B: .* is not a directory"):
        diff_runs(DiffConfig(b, tmp_path / "missing"))


@pytest.mark.parametrize("options, message", [({"metric": "cpu"}, "--metric"), ({"min_change": -0.1}, "--min-change"),
                                              ({"min_change": 1.5}, "--min-change")])
def test_bad_options(tmp_path, options, message):
    with pytest.raises(UsageError, match=message):
        DiffConfig(tmp_path, tmp_path, **options)


def test_aa_false_alarm_rate(tmp_path):
    """Twenty A/A pairs (same distribution, fresh noise): Holm keeps false SLOWER/FASTER calls rare."""
    alarms = 0
    for i in range(20):
        a = write_run(tmp_path / f"a{i}", seed=100 + i)
        b = write_run(tmp_path / f"b{i}", seed=200 + i)
        result = diff_runs(DiffConfig(a, b), write=False)
        alarms += int((result.rows.status != NO_SIGNIFICANT_DIFFERENCE).any())
    assert alarms <= 2


# ----------------------------------------------------------------------------------------------------------------
# files


def test_default_out_dir_and_files(tmp_path):
    a = write_run(tmp_path / "before", seed=1)
    b = write_run(tmp_path / "after", seed=2, scale={("train", "patched"): 1.05})
    result = diff_runs(DiffConfig(a, b))
    out = b / "diff-vs-before"
    assert result.out_dir == out
    assert sorted(p.name for p in out.iterdir()) == ["diff.md", "diff.parquet"]  # no temporary files left
    frame = pd.read_parquet(out / "diff.parquet")
    assert len(frame) == len(MEDIANS) + 2 and list(frame.kind) == ["arm"] * len(MEDIANS) + ["speedup"] * 2
    slow = frame[(frame.kind == "arm") & (frame.workload == "train") & (frame.arm == "patched")].iloc[0]
    assert slow.status == SLOWER and slow.run_a == str(a) and slow.metric == "wall"
    text = (out / "diff.md").read_text()
    assert "| train | patched | 40/40 |" in text and "REGRESSION: train/patched SLOWER" in text


# ----------------------------------------------------------------------------------------------------------------
# the committed H200 runs (same comparison, same day, another card)


@pytest.fixture(scope="module")
def h200(tmp_path_factory):
    return diff_runs(DiffConfig(H200_FIRST, H200_PROFILED, out=tmp_path_factory.mktemp("h200")))


def test_h200_speedups_match_each_runs_own_summary(h200):
    """Each run's speedup and interval as its summary gave them, widened by the process noise: these runs are from
    before e2eprof folded it in, so they get the H200 default (one process per arm)."""
    speedups = rows_by_key(h200, "speedup")
    assert set(speedups) == {(w, "patched") for w in ("train", "infer", "generate")}
    noise = DeviceDefaults.for_device("cuda").process_noise
    for run, side in ((H200_FIRST, "a"), (H200_PROFILED, "b")):
        summary = pd.read_parquet(run / "summary.parquet").set_index(["workload", "arm"])
        assert "process_noise" not in summary  # the premise: nothing was folded in when these ran
        for key, row in speedups.items():
            own = summary.loc[key]
            widened = stats.with_process_noise(stats.RatioCI(own.speedup_vs_baseline, own.ci_low, own.ci_high, 0.95,
                                                             0, "stored"), noise)
            assert getattr(row, f"speedup_{side}") == pytest.approx(own.speedup_vs_baseline, rel=1e-12)
            assert getattr(row, f"speedup_{side}_low") == pytest.approx(widened.low, rel=1e-12)
            assert getattr(row, f"speedup_{side}_high") == pytest.approx(widened.high, rel=1e-12)


def test_h200_train_speedup_grew_by_a_point(h200):
    train = rows_by_key(h200, "speedup")[("train", "patched")]
    assert round(train.speedup_a, 3) == 1.040 and round(train.speedup_b, 3) == 1.052
    # The two runs' within-run intervals ([1.033, 1.045] and [1.046, 1.054]) do not overlap, but each is one process
    # per arm on its own card: two such processes differ by ~0.44% with no change at all, so 1.2 points is not
    # told apart from that (it was BELOW_MARGIN before the process noise was folded in).
    assert train.diff_low < 0 < 0.012 < train.diff_high
    assert train.status == NO_SIGNIFICANT_DIFFERENCE
    # generate's speedup is far too noisy (0.78x [0.71, 0.91]) to tell 0.78 from 0.83.
    assert rows_by_key(h200, "speedup")[("generate", "patched")].status == NO_SIGNIFICANT_DIFFERENCE


def test_h200_what_changed_and_what_got_worse(h200):
    # The profiled run ran on another physical H200 with the same software; it added clock telemetry.
    assert any(c.startswith("GPU UUID") for c in h200.changes)
    assert "SM clock telemetry: none -> 1980 MHz" in h200.changes
    assert not any(c.startswith(("torch", "driver", "patch source")) for c in h200.changes)
    # Its infer verdict was the profile-check bug fixed later (KERNEL_NOT_RUN): a flag, not a regression.
    assert any(f.startswith("VERDICT_CHANGED: infer") and "KERNEL_NOT_RUN" in f for f in h200.flags)
    # Stock SDPA inference was 20.1 ms in the first run and 24.0 ms in the profiled one (19.9 ms in the
    # re-run): the one arm that got worse by more than the margin.
    arms = rows_by_key(h200, "arm")
    assert [k for k, r in arms.items() if r.status == SLOWER] == [("infer", "sdpa")]
    assert arms[("infer", "sdpa")].ci_low > 1.1
    assert h200.exit_code == 1


# ----------------------------------------------------------------------------------------------------------------
# the real entry point


def e2eprof(args: list[str], cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "E2EPROF_DEBUG"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "e2eprof", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_cli_exit_codes_and_output(tmp_path):
    a = write_run(tmp_path / "a", seed=1)
    same = write_run(tmp_path / "same", seed=2)
    slower = write_run(tmp_path / "slower", seed=2, scale={("infer", "baseline"): 1.05})
    other = write_run(tmp_path / "other", seed=2, config={"seq": 512})

    result = e2eprof(["diff", str(a), str(same), "--out", str(tmp_path / "d0")], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "no significant regression" in result.stdout and (tmp_path / "d0" / "diff.md").is_file()

    result = e2eprof(["diff", str(a), str(slower), "--out", str(tmp_path / "d1"), "--min-change", "0.02"], cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "SLOWER" in result.stdout and "REGRESSION: infer/baseline SLOWER" in result.stdout
    # The margin is honoured: 5% slower is not beyond 10%.
    result = e2eprof(["diff", str(a), str(slower), "--out", str(tmp_path / "d2"), "--min-change", "0.1"], cwd=tmp_path)
    assert result.returncode == 0, result.stdout

    result = e2eprof(["diff", str(a), str(other)], cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("e2eprof: error: ") and "seq: 1024 vs 512" in lines[0], result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not (other / "diff-vs-a").exists()

    result = e2eprof(["diff", str(a), str(same), "--metric", "energy"], cwd=tmp_path)
    assert result.returncode == 2 and "--metric" in result.stderr


# ----------------------------------------------------------------------------------------------------------------
# sweeps: rows per (point, workload, arm), grids that differ, points that ran out of memory


def write_sweep(path: Path, *, seed: int, points: list[tuple[int, int, str]], scale: dict | None = None,
                oom: tuple = (), n: int = 20) -> Path:
    """A sweep's report directory: warm steps per point with the identity columns, run.parquet's points_json.

    Step time grows with batch x seq, so a diff that pooled points would see a spread far beyond any shift here.
    scale multiplies (point id, workload, arm); oom lists (point id, workload) where every arm ran out of memory
    (a correctness row with metric "oom" per arm and no step, as compare records it).
    """
    rng = np.random.default_rng(seed)
    scale = scale or {}
    steps, checks = [], []
    grid = [SweepPoint(*p) for p in points]
    for point in grid:
        size = point.batch * point.seq / 8192
        for (workload, arm), median in MEDIANS.items():
            if (point.id, workload) in oom:
                checks.append({"workload": workload, "arm": arm, "tensor": "-", "metric": "oom", "value": np.nan,
                               "tolerance": np.nan, "passed": False, "detail": "out of memory during cold: MemoryError",
                               **point.columns()})
                continue
            wall = median * size * scale.get((point.id, workload, arm), 1.0) * rng.lognormal(0.0, 0.01, n)  # (n,) ms
            for i, ms in enumerate(wall):
                steps.append({"run_id": path.name, "workload": workload, "arm": arm, "block": i // 5, "step": i,
                              "phase": "warm", "wall_ns": int(ms * 1e6), "device_ms": ms * 0.95, "start_unix_ns": 0,
                              "end_unix_ns": 0, "ttft_ms": np.nan, "tpot_ms": np.nan, **point.columns()})
    axes = {key: list(dict.fromkeys(getattr(p, key) for p in grid)) for key in ("batch", "seq", "precision")}
    config = CONFIG | {k: v[0] if len(v) == 1 else v for k, v in axes.items()}
    run = {"run_id": path.name, "schema_version": 1, "status": "complete", "command_line": "e2eprof compare",
           "config_json": json.dumps(config), "environment_json": json.dumps(ENVIRONMENT), "patch_spec": "fastsoftmax",
           "patch_origin": "builtin", "patch_source_sha256": "65b52ab5" * 8, "seed": 0, "batch_digest": "988eeeca",
           "started_unix_ns": 0, "ended_unix_ns": 1, "points_json": json.dumps([p.columns() for p in grid]),
           "model_json": json.dumps({"architecture": "gpt2", "n_layer": 12, "n_params": 124439808, "vocab_size": 50257})}
    reports.write_table(path, "run", [run])
    reports.write_table(path, "steps", steps)
    if checks:
        reports.write_table(path, "correctness", checks)
    return path


GRID = [(8, 512, "bf16"), (8, 1024, "bf16"), (16, 1024, "bf16")]


def by_point_key(result, kind: str) -> dict:
    frame = result.rows[result.rows.kind == kind]
    return {(r.point, r.workload, r.arm): r for r in frame.itertuples()}


def test_sweep_rows_are_keyed_by_point_and_a_shift_at_one_point_stays_there(tmp_path):
    a = write_sweep(tmp_path / "a", seed=1, points=GRID)
    b = write_sweep(tmp_path / "b", seed=2, points=GRID, scale={("b8-s1024-bf16", "train", "patched"): 1.05})
    result = run_diff(tmp_path, a, b)
    arms = by_point_key(result, "arm")
    ids = [SweepPoint(*p).id for p in GRID]
    assert set(arms) == {(p, w, arm) for p in ids for w, arm in MEDIANS}
    # Each row's medians are its own point's: b16-s1024 steps take 4x as long as b8-s512 ones.
    for (point, workload, arm), row in arms.items():
        size = {"b8-s512-bf16": 0.5, "b8-s1024-bf16": 1.0, "b16-s1024-bf16": 2.0}[point]
        assert row.median_a_ms == pytest.approx(MEDIANS[(workload, arm)] * size, rel=0.02)
    assert [k for k, r in arms.items() if r.status != NO_SIGNIFICANT_DIFFERENCE] == [("b8-s1024-bf16", "train", "patched")]
    assert arms[("b8-s1024-bf16", "train", "patched")].status == SLOWER
    speedups = by_point_key(result, "speedup")
    assert set(speedups) == {(p, w, "patched") for p in ids for w in ("train", "infer")}
    assert [k for k, r in speedups.items() if r.status != NO_SIGNIFICANT_DIFFERENCE] == [("b8-s1024-bf16", "train", "patched")]
    assert result.exit_code == 1 and result.flags == []
    text = (tmp_path / "diff" / "diff.md").read_text()
    assert "| point | workload | arm | n A/B |" in text and "| b8-s1024-bf16 | train | patched | 20/20 |" in text
    assert "REGRESSION: b8-s1024-bf16/train/patched SLOWER" in text
    assert set(pd.read_parquet(tmp_path / "diff" / "diff.parquet").point) == set(ids)


def test_overlapping_grids_diff_the_common_points_and_flag_the_rest(tmp_path):
    a = write_sweep(tmp_path / "a", seed=1, points=GRID[:2])
    b = write_sweep(tmp_path / "b", seed=2, points=GRID[1:])
    result = run_diff(tmp_path, a, b)
    assert result.different_comparison == []  # batch 8 vs 8,16 is not refused: the grids share b8-s1024-bf16
    assert "DIFFERENT_GRID: A has 2 point(s), B 2; 1 in common are diffed" in result.flags
    assert f"{ONLY_IN_A}: point 'b8-s512-bf16' was run only in A" in result.flags
    assert f"{ONLY_IN_B}: point 'b16-s1024-bf16' was run only in B" in result.flags
    arms = by_point_key(result, "arm")
    status = {(p, w, arm): r.status for (p, w, arm), r in arms.items()}
    assert {s for (p, _, _), s in status.items() if p == "b8-s512-bf16"} == {ONLY_IN_A}
    assert {s for (p, _, _), s in status.items() if p == "b16-s1024-bf16"} == {ONLY_IN_B}
    assert {s for (p, _, _), s in status.items() if p == "b8-s1024-bf16"} == {NO_SIGNIFICANT_DIFFERENCE}
    assert {k[0] for k in by_point_key(result, "speedup")} == {"b8-s1024-bf16"}
    assert result.exit_code == 0


def test_grids_without_a_common_point_are_different_comparisons(tmp_path):
    a = write_sweep(tmp_path / "a", seed=1, points=[(1, 512, "bf16"), (2, 512, "bf16")])
    b = write_sweep(tmp_path / "b", seed=2, points=[(4, 512, "bf16"), (8, 512, "bf16")])
    with pytest.raises(UsageError) as error:
        run_diff(tmp_path, a, b)
    assert "batch: 1,2 vs 4,8" in str(error.value) and "seq" not in str(error.value)
    allowed = run_diff(tmp_path, a, b, allow_different=True)
    assert {r.status for r in allowed.rows.itertuples()} == {ONLY_IN_A, ONLY_IN_B}


def test_point_out_of_memory_in_b_is_a_regression(tmp_path):
    a = write_sweep(tmp_path / "a", seed=1, points=GRID)
    b = write_sweep(tmp_path / "b", seed=2, points=GRID, oom=(("b16-s1024-bf16", "train"),))
    result = run_diff(tmp_path, a, b)
    arms = by_point_key(result, "arm")
    assert {arms[("b16-s1024-bf16", "train", arm)].status for arm in ("baseline", "patched", "sdpa")} == {OUT_OF_MEMORY_IN_B}
    assert arms[("b16-s1024-bf16", "infer", "patched")].status == NO_SIGNIFICANT_DIFFERENCE
    assert "OUT_OF_MEMORY: b16-s1024-bf16/train: baseline, patched, sdpa in B" in result.flags
    assert ("b16-s1024-bf16", "train", "patched") not in by_point_key(result, "speedup")
    assert result.exit_code == 1 and "b16-s1024-bf16/train/patched OUT_OF_MEMORY_IN_B" in outcome(result)
    # The other way round it is no regression: B fits what A could not.
    back = diff_runs(DiffConfig(b, a, out=tmp_path / "back"))
    assert {r.status for r in back.rows.itertuples() if r.point == "b16-s1024-bf16" and r.workload == "train"} == {OUT_OF_MEMORY_IN_A}
    assert back.exit_code == 0


def test_run_from_before_sweeps_against_a_run_of_one_point(tmp_path):
    old = write_run(tmp_path / "old", seed=1)  # no point column anywhere, as the committed H200 runs
    new = write_sweep(tmp_path / "new", seed=2, points=[(8, 1024, "bf16")])
    result = run_diff(tmp_path, old, new)
    assert set(rows_by_key(result, "arm")) == set(MEDIANS) and set(result.rows.point) == {"b8-s1024-bf16"}
    assert not result.sweep and "DIFFERENT_GRID" not in " ".join(result.flags)
    text = (tmp_path / "diff" / "diff.md").read_text()
    assert "| workload | arm | n A/B |" in text and "| point |" not in text  # one point: the table as before
    with pytest.raises(UsageError, match="batch: 8 vs 16"):
        run_diff(tmp_path, old, write_sweep(tmp_path / "b16", seed=2, points=[(16, 1024, "bf16")]))
