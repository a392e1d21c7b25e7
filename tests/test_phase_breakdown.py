"""benchmarks/phase_breakdown.py on committed runs: phases summed per run, the total, the compile arm's first steps."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "phase_breakdown.py"
GPU_RUN = ROOT / "reports" / "2026-12-04-h200-gate-cost" / "default-run"
CPU_RUN = ROOT / "reports" / "2026-12-06-cpu-default-run"


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)


def _cell(text: str, row: str, column: int) -> float:
    line = next(line for line in text.splitlines() if line.startswith(f"| {row} |"))
    return float(line.strip("|").split("|")[column])


def test_two_runs_side_by_side_with_totals_and_the_compile_arm():
    done = _run(GPU_RUN, CPU_RUN)
    assert done.returncode == 0, done.stderr
    gpu = pd.read_parquet(GPU_RUN / "phases.parquet")
    cpu = pd.read_parquet(CPU_RUN / "phases.parquet")
    assert abs(_cell(done.stdout, "**total**", 1) - gpu.seconds.sum()) < 0.06
    assert abs(_cell(done.stdout, "**total**", 2) - cpu.seconds.sum()) < 0.06
    cold = gpu[gpu.phase == "cold step"].seconds.sum()
    assert abs(_cell(done.stdout, "cold step", 1) - cold) < 0.06
    steps = pd.read_parquet(GPU_RUN / "steps.parquet")
    first = steps[(steps.phase == "cold") & (steps.arm == "compile")].wall_ns.sum() / 1e9
    line = next(line for line in done.stdout.splitlines() if line.startswith("| of which the compile arm"))
    assert abs(float(line.strip("|").split("|")[1]) - first) < 0.06 and line.strip("|").split("|")[2].strip() == "-"


def test_by_workload_and_a_folder_without_phases():
    done = _run(GPU_RUN, "--by-workload")
    assert "| correctness (train) |" in done.stdout and "| correctness (decode) |" in done.stdout
    missing = _run(ROOT / "reports")
    assert missing.returncode == 2 and "no phases.parquet" in missing.stderr and "Traceback" not in missing.stderr


def test_runs_with_different_phases_keep_the_run_order(tmp_path):
    # An interrupted run has no "summary and tables": the rows must still read in the run's order, not alphabetically.
    cut = tmp_path / "interrupted"
    cut.mkdir()
    phases = pd.read_parquet(GPU_RUN / "phases.parquet")
    phases[phases.phase != "summary and tables"].to_parquet(cut / "phases.parquet")
    done = _run(cut, GPU_RUN)
    assert done.returncode == 0, done.stderr
    rows = [line.split("|")[1].strip() for line in done.stdout.splitlines()[2:]]
    order = [row for row in rows if not row.startswith("**") and not row.startswith("of which")]
    assert order[0] == "start-up and checks" and order[-1] == "summary and tables", order
    assert order.index("cold step") < order.index("correctness") < order.index("timing") < order.index("profile")
    line = next(line for line in done.stdout.splitlines() if line.startswith("| summary and tables |"))
    assert line.strip("|").split("|")[1].strip() == "-"  # the interrupted run has none


def test_workers_start_up_in_seconds_from_the_command_start(tmp_path):
    import json

    run = tmp_path / "run"
    run.mkdir()
    phases = pd.read_parquet(GPU_RUN / "phases.parquet")
    phases.to_parquet(run / "phases.parquet")
    origin = int(phases[phases.phase == "start-up and checks"].start_unix_ns.iloc[0])
    startup = {"baseline": {"started_unix_ns": origin + 300_000_000, "imported": 16.5, "setup": 16.9, "build": 17.0,
                            "build_s": 1.5},
               "compile": {"started_unix_ns": None}}
    pd.DataFrame([{"run_id": "r", "startup_json": json.dumps(startup)}]).to_parquet(run / "run.parquet")
    done = _run(run, "--workers")
    assert done.returncode == 0, done.stderr
    assert "| baseline | 0.3 | 16.8 | 17.2 | 17.3 | 18.8 |" in done.stdout
    assert "| compile | - | - | - | - | - |" in done.stdout
    without = _run(GPU_RUN, "--workers")
    assert without.returncode == 0 and "no startup_json in run.parquet" in without.stdout
