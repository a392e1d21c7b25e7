"""benchmarks/results_table_rows.py reads README's results-table rows from committed H200 run directories."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "results_table_rows.py"
REPORTS = ROOT / "reports"


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
