"""benchmarks/results_table_rows.py reads README's results-table rows from H200 run directories (their tables in tests/data)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "results_table_rows.py"
REPORTS = ROOT / "tests" / "data" / "h200-runs"  # summary and config columns of the runs


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, check=False)


def test_rows_carry_the_runs_own_figures_and_both_references():
    done = run(str(REPORTS / "2026-12-02-h200-gpt2-fastsoftmax-default"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    train = next(line for line in lines if line.startswith("| train "))
    # The default run's train row as README's example shows it: measured, verdict and both references.
    assert "1.038x [1.035, 1.043]" in train and "PASS (FASTER)" in train
    assert "0.680x" in train and "0.322x" in train
    generate = next(line for line in lines if line.startswith("| generate "))
    assert generate.endswith("| - |"), "compile sits out decoding, so its cell is empty, not a number"


def test_a_run_without_a_compile_arm_says_so():
    done = run(str(REPORTS / "2026-12-02-h200-gpt2-fastgelu"))
    assert done.returncode == 0, done.stderr
    assert all(line.endswith("| no compile arm |") for line in done.stdout.splitlines()
               if line.startswith(("| train ", "| infer ")))


def test_a_folder_that_is_not_a_run_is_a_one_line_error(tmp_path):
    done = run(str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "summary.parquet" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_unprofiled_run_without_reference_arms_has_no_prediction_and_no_references():
    # 2026-12-02 llama-1b: --reference none --no-profile, so summary.parquet has no predicted_speedup column and
    # no sdpa arm was asked for: the baseline's attention is not known from the run, so no "baseline is SDPA".
    done = run(str(REPORTS / "2026-12-02-h200-llama-1b-rmsnorm"))
    assert done.returncode == 0, done.stderr
    train = next(line for line in done.stdout.splitlines() if line.startswith("| train "))
    assert train == "| train | - | 1.072x [1.069, 1.075] | PASS (FASTER) | no sdpa arm | no compile arm |"


def test_a_baseline_that_already_is_sdpa_is_named_so():
    done = run(str(REPORTS / "2026-12-03-h200-gpt2-fastgelu-references"))
    assert done.returncode == 0, done.stderr
    train = next(line for line in done.stdout.splitlines() if line.startswith("| train "))
    assert "| 1.128x [1.117, 1.139] (baseline is stock SDPA) | 0.528x [0.523, 0.533] |" in train


def test_a_run_of_several_candidates_gives_a_row_per_candidate_and_workload():
    # The 2026-12-04 llama-1b run: four candidates, infer, no reference arms.
    done = run(str(REPORTS / "2026-12-04-h200-llama-1b-candidates"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].startswith("| candidate | workload |")
    rows = [line for line in lines[3:] if line.startswith("| ")]
    assert sorted(line.split(" | ")[0][2:] for line in rows) == ["liger-rmsnorm", "liger-swiglu", "rmsnorm", "swiglu"]
    rmsnorm = next(line for line in rows if line.startswith("| rmsnorm | infer |"))
    assert "1.111x [1.088, 1.123]" in rmsnorm


def test_an_sdpa_arm_that_failed_is_not_taken_for_an_sdpa_baseline():
    # 2026-12-05 H100: the sdpa arm ran out of memory in training's cold step and took no further part; the
    # softmax kernels' baseline is eager attention, so "baseline is stock SDPA" would be false.
    done = run(str(ROOT / "tests" / "data" / "h100-runs" / "2026-12-05-h100-gpt2-softmax-candidates"))
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| fastsoftmax |")]
    assert len(rows) == 3 and all("| sdpa arm failed |" in line for line in rows)
    assert not any("baseline is stock SDPA" in line for line in done.stdout.splitlines())
