"""benchmarks/self_benchmark.py dry-run on the CPU: every part runs for real on gpt2-tiny with tiny settings and writes
its Parquet table and markdown section. Parts that need CUDA must say why they did not measure.

The runs share one output folder in file order, as the device calls do: sensitivity takes its baseline from aa.
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "self_benchmark.py"
TINY = ["--model", "gpt2-tiny", "--steps", "6", "--seq", "16"]


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("self-benchmark")


def run_part(out: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done


def read(out: Path, part: str) -> tuple[pd.DataFrame, str]:
    table = pd.read_parquet(out / f"{part}.parquet")
    text = (out / f"{part}.md").read_text()
    assert text.startswith(f"## {part}\n")
    for line in ("- measured: ", "- target: ", "- date: ", "- reproduce: `python3 benchmarks/self_benchmark.py"):
        assert line in text
    assert {"date", "gpu", "torch", "transformers", "triton", "model", "self_benchmark_command"} <= set(table.columns)
    return table, text


def load_module():
    spec = importlib.util.spec_from_file_location("self_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is being built
    spec.loader.exec_module(module)
    return module


def test_binomial_bounds_match_closed_forms():
    sb = load_module()
    # 0 of n: the upper bound solves (1 - p)^n = 0.05; n of n: the lower bound solves p^n = 0.05.
    assert sb.binomial_upper(0, 20) == pytest.approx(1 - 0.05 ** (1 / 20), abs=1e-6)
    assert sb.binomial_lower(10, 10) == pytest.approx(0.05 ** (1 / 10), abs=1e-6)
    assert sb.binomial_upper(3, 20) > 3 / 20 > sb.binomial_lower(3, 20)


def test_profiled_forward_time_on_a_committed_h200_profile():
    """The figure agreement compares: per-call forward kernel time of the replaced op, from kernels.parquet."""
    sb = load_module()
    run = ROOT / "tests" / "data" / "h200-runs" / "2026-12-02-h200-gpt2-fastsoftmax-profiled"  # train rows only
    ops, kernels = pd.read_parquet(run / "ops.parquet"), pd.read_parquet(run / "kernels.parquet")
    for arm, kernel in (("baseline", "softmax_warp_forward"), ("patched", "_softmax_fwd_row_kernel")):
        us, names = sb.profiled_forward_us(ops, kernels, arm, "train")
        assert len(names) == 1 and kernel in next(iter(names))
        # ops.parquet's own per-call mean of the same region: a median and a mean of one steady kernel agree.
        region = ops[(ops.arm == arm) & (ops.workload == "train") & ops.in_replaced & (ops.direction == "fwd")
                     & (ops.self_device_us > 0)]
        assert us == pytest.approx(float((region.self_device_us / region["count"]).sum()), rel=0.01)
    assert sb.profiled_forward_us(ops, kernels, "sdpa", "train")[0] == 0  # nothing replaced in a stock arm


def test_phase_sm_clock_reads_only_the_phase_window(tmp_path):
    """The loop's SM clock in the agreement table: samples inside the phase, none from before or after it."""
    sb = load_module()
    ns = 1_000_000_000
    pd.DataFrame({"workload": ["train", "train"], "phase": ["timing", "profile"],
                  "start_unix_ns": [0, 10 * ns], "end_unix_ns": [10 * ns, 20 * ns]}).to_parquet(tmp_path / "phases.parquet")
    clocks = [1980.0] * 10 + [1500.0, 1510.0, 1520.0] * 3 + [1980.0] * 10  # the profile phase ran at ~1510 MHz
    times = [i * ns // 2 for i in range(10)] + [10 * ns + i * ns for i in range(9)] + [30 * ns + i * ns for i in range(10)]
    pd.DataFrame({"unix_ns": times, "sm_clock_mhz": clocks}).to_parquet(tmp_path / "telemetry.parquet")
    assert sb.phase_sm_clock(tmp_path, "train", "profile") == 1510.0
    assert math.isnan(sb.phase_sm_clock(tmp_path, "infer", "profile"))  # no such phase
    assert math.isnan(sb.phase_sm_clock(tmp_path / "missing", "train", "profile"))  # a run without telemetry


def test_aa_runs_calibrate_and_records_each_run(out):
    run_part(out, "--part", "aa", "--runs", "1", *TINY)
    table, text = read(out, "aa")
    assert len(table) == 1 and table.run.tolist() == [0] and (table.error == "").all()
    assert {"verdict", "reasons", "speedup", "ci_low", "ci_high", "mw_p_adjusted", "significant", "blocks",
            "baseline_median_ms", "command"} <= set(table.columns)
    assert table.command.iloc[0].startswith("python3 -m e2eprof calibrate --model gpt2-tiny")
    assert (out / "runs" / "aa-000" / "summary.parquet").exists()
    assert "A/A runs significant" in text
    stamp = load_module().source_stamp()
    assert table.source.iloc[0] == stamp and f"source {stamp}" in text


def test_aa_over_several_workloads_gives_a_row_per_run_and_workload(tmp_path):
    # What the GPU figures use: one calibrate over the default workloads per run, each workload judged on its own.
    run_part(tmp_path, "--part", "aa", "--runs", "1", "--workload", "train,decode", *TINY)
    table = pd.read_parquet(tmp_path / "aa.parquet")
    assert table.workload.tolist() == ["train", "decode"] and table.run.tolist() == [0, 0]
    assert (table.error == "").all() and table.verdict.notna().all() and (table.baseline_median_ms > 0).all()
    assert table.command.iloc[0].startswith("python3 -m e2eprof calibrate --model gpt2-tiny --workload train,decode")
    # the two rows are the two workloads' own verdict rows, not one row twice
    summary = pd.read_parquet(tmp_path / "runs" / "aa-000" / "summary.parquet")
    signed = summary[summary.verdict.notna()].set_index("workload")
    assert table.set_index("workload").speedup.to_dict() == signed.speedup_vs_baseline.to_dict()
    text = (tmp_path / "aa.md").read_text()
    assert text.startswith("## aa\n") and "### aa: train\n" in text and "### aa: decode\n" in text
    assert text.count("- measured: ") == 2


def test_aa_calibrates_the_patch_it_is_given(tmp_path):
    # llama's A/A (the results table's rmsnorm and swiglu rows) needs a patch that applies to llama: fastsoftmax,
    # calibrate's default, is refused there.
    run_part(tmp_path, "--part", "aa", "--runs", "1", "--workload", "infer", "--patch", "rmsnorm",
             "--model", "llama-tiny", "--steps", "6", "--seq", "16")
    table = pd.read_parquet(tmp_path / "aa.parquet")
    assert (table.error == "").all() and table.verdict.notna().all()
    assert "--patch rmsnorm" in table.command.iloc[0] and "--patch rmsnorm" in table.e2eprof_options.iloc[0]


def test_source_stamp_changes_with_the_measuring_code(tmp_path):
    sb = load_module()
    for folder in sb.SOURCE_FOLDERS:
        (tmp_path / folder).mkdir()
    (tmp_path / "e2eprof" / "stats.py").write_text("NOISE = 0.01\n")
    (tmp_path / "README.md").write_text("prose is not measuring code\n")
    before = sb.source_stamp(tmp_path)
    (tmp_path / "README.md").write_text("changed prose\n")
    assert sb.source_stamp(tmp_path) == before
    (tmp_path / "e2eprof" / "stats.py").write_text("NOISE = 0.02\n")
    assert sb.source_stamp(tmp_path) != before


def test_sensitivity_sizes_the_delay_from_the_aa_baseline(out):
    run_part(out, "--part", "sensitivity", "--runs", "1", "--levels", "0.05", "--budget", "0", *TINY)
    table, text = read(out, "sensitivity")
    aa = pd.read_parquet(out / "aa.parquet")
    row = table.iloc[0]
    assert row.calls_per_step == 2  # gpt2-tiny: two layers, one softmax each per forward
    assert row.baseline_median_ms == pytest.approx(aa.baseline_median_ms.median())
    assert row.delay_us == pytest.approx(0.05 * row.baseline_median_ms * 1e3 / 2)
    assert {"level", "detected", "verdict", "speedup", "measured_slowdown", "timing_s"} <= set(table.columns)
    assert "E2EPROF_PLANTED_DELAY_US=" in row.command and "--patch planted-slowdown" in row.command
    assert "| 5.0% |" in text and "the 1% level was not run" in text


def test_overhead_times_every_condition_in_every_block(out):
    run_part(out, "--part", "overhead", "--blocks", "2", "--block-steps", "1", *TINY)
    table, text = read(out, "overhead")
    assert set(table.condition) == {"bare", "sampler", "sampler+bookkeeping"}
    assert table.groupby(["condition", "block"]).size().eq(1).all()
    assert (table.step_ms > 0).all()
    if not torch.cuda.is_available():
        assert "sampler not running: no CUDA device" in text


def test_cost_splits_the_compare_into_its_phases(out):
    # --reference none reaches the compare: the CPU's default sdpa arm must be missing from the cold steps below.
    run_part(out, "--part", "cost", "--workload", "train", "--reference", "none", "--block-steps", "2", *TINY)
    table, text = read(out, "cost")
    # One workload and no reference arm is a narrower compare than the default: its time is not judged against 180 s.
    assert "**not judged: not the default compare**" in text and "--reference none" in table.e2eprof_options.iloc[0]
    phases = set(table.phase)
    assert {"start-up and checks", "timing", "correctness", "unattributed (summary printing, exit)",
            "report (e2eprof report)"} <= phases
    # The command's own start-up is now measured: what is left unattributed is the summary's printing and the exit.
    startup = float(table[table.phase == "start-up and checks"].seconds.iloc[0])
    rest = float(table[table.phase.str.startswith("unattributed")].seconds.iloc[0])
    assert startup > 1.0 and 0 <= rest < startup  # an interpreter importing torch takes seconds; exiting, less
    assert (table.error.fillna("") == "").all()
    compare_phases = table[~table.phase.str.startswith("report")]
    # Phases plus the unattributed rest add up to the process's wall time.
    assert compare_phases.seconds.sum() == pytest.approx(table.compare_wall_s.iloc[0])
    assert "s in all, timing" in text
    assert set(table.phase_workload) == {"*", "train"} and "by workload (cold step to profile): train" in text
    assert "cold steps by arm" in text and {"baseline", "patched"} == {
        part.split()[0] for part in table.cold_by_arm.iloc[0].split(", ")}


def test_agreement_needs_cuda_and_says_so(out):
    run_part(out, "--part", "agreement", *TINY)
    table, text = read(out, "agreement")
    if torch.cuda.is_available():
        assert set(table.status) == {"measured"}
        assert {"e2eprof_us", "do_bench_us", "timer_us", "in_loop_us", "loop_sm_clock_mhz"} <= set(table.columns)
        assert (table.e2eprof_us > 0).all()  # the isolated profile found the op's kernels
    else:
        assert table.status.tolist() == ["skipped"] and "needs CUDA" in table.reason.iloc[0]
        assert "**not measured**" in text


@pytest.mark.parametrize(("args", "message"), [
    (["--part", "sensitivity", "--levels", "two"], "error: --levels"),
    (["--part", "aa", "--reference", "sdpa"], "error: --reference: only the cost part"),  # aa sets its own arms
    (["--part", "sensitivity", "--workload", "train,decode"], "error: --workload: the sensitivity part measures one"),
    (["--part", "sensitivity", "--patch", "rmsnorm"], "error: --patch: only the aa part"),  # it plants its own
])
def test_bad_options_are_a_usage_error(out, args, message):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(SCRIPT), *args, "--out", str(out)],
                          capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    assert done.returncode == 2 and done.stderr.strip().startswith(message)
    assert "Traceback" not in done.stderr


def test_a_workload_floor_is_judged_only_on_runs_made_under_it():
    sb = load_module()

    def row(speedup, noise_floor=None):
        return {"speedup": speedup, "ci_low": speedup * 0.993, "ci_high": speedup * 1.007, "process_noise": 0.0031,
                "processes": 2, "mw_p_adjusted": 0.001, "verdict": "PASS", "significant": False, "error": "",
                "noise_floor": noise_floor}

    earlier = [row(0.992), row(1.004), row(0.9915), row(1.0)]  # the runs a decode floor of 0.67% was set from
    table = pd.DataFrame(earlier + [row(1.002, 0.0067), row(0.999, 0.0067), row(0.97, 0.0067)])
    text, meets, detail = sb.figure("aa", table, default_noise=0.0067, default_replicas=2, device_noise=0.0044)
    assert text.startswith("1 of 3 A/A runs significant") and "the workload's own floor" in text  # 0.97x only
    assert meets == sb.UNRESOLVED  # 3 runs are too few to judge the target
    assert "of the runs measured with a default in force (not used to set it) 1 of 3" in " ".join(detail)
    held = sb.held_out_runs(table, 0.0044, 0.0044)  # the device's own floor: old runs with noise folded in count
    assert held.tolist() == [True] * 7
