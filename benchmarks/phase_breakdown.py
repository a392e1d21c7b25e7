"""Where each run's own time went, side by side: phases.parquet of one or more run folders as one markdown table.

One column per run (its folder name), one row per phase summed over the run's workloads (start-up and checks, start
workers and build models, cold step, correctness, warm-up, timing, revalidation, profile, stop workers, summary and
tables), then the total, then the compile arm's first steps (from steps.parquet: what its cold steps hold of the
run). --by-workload splits the per-workload phases by workload as well. --workers adds, per run, each worker
process's start-up in seconds into the command (run.parquet's startup_json): when it started, when its imports were
done, when it read its setup and when its model was built; on a GPU host the last of these decides when the first
step can run.

Usage: python3 benchmarks/phase_breakdown.py RUN_DIR [RUN_DIR ...] [--by-workload] [--workers]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

from e2eprof.tables.rundir import RunDir

ORDER = ("start-up and checks", "start workers and build models", "cold step", "correctness", "warm-up", "timing",
         "revalidation", "profile", "stop workers", "summary and tables")


def _rank(label: str) -> int:
    """A phase's place in ORDER, for "phase" or "phase (workload)"; unknown phases last."""
    phase = label.split(" (")[0]
    return ORDER.index(phase) if phase in ORDER else len(ORDER)


def phase_seconds(run: Path, by_workload: bool) -> pd.Series:
    """Seconds per phase of one run, in the order the run goes through them; with by_workload a row per phase and
    workload, labelled "phase (workload)"."""
    phases = RunDir(run).read("phases")
    keys = ["phase", "workload"] if by_workload else ["phase"]
    seconds = phases.groupby(keys, sort=False).seconds.sum()
    workloads = {w: i for i, w in enumerate(dict.fromkeys(phases.workload))}
    rows = [(key, "*") if not by_workload else key for key in seconds.index]
    order = sorted(range(len(rows)), key=lambda i: (_rank(rows[i][0]), workloads.get(rows[i][1], 0)))
    labels = [phase if workload == "*" else f"{phase} ({workload})" for phase, workload in rows]
    return pd.Series([seconds.iloc[i] for i in order], index=[labels[i] for i in order])


def compile_first_steps(run: Path) -> float:
    """Seconds of the compile arm's cold steps, all workloads together (NaN: no compile arm, or no steps table)."""
    if not RunDir(run).has("steps"):  # a report that kept only some tables
        return math.nan
    steps = RunDir(run).read("steps")
    cold = steps[(steps.phase == "cold") & (steps.arm == "compile")]
    return float(cold.wall_ns.sum() / 1e9) if len(cold) else math.nan


def table(runs: list[Path], by_workload: bool = False) -> str:
    columns = {run.name: phase_seconds(run, by_workload) for run in runs}
    # The runs' phases in the run's order: a DataFrame of Series with different phases (an interrupted run has no
    # "summary and tables") sorts their union alphabetically. The sort is stable, so workloads keep their order.
    labels = sorted(dict.fromkeys(label for series in columns.values() for label in series.index), key=_rank)
    frame = pd.DataFrame(columns).reindex(labels)
    head = "| phase |" + "".join(f" {n} s |" for n in columns) + "\n|---|" + "---:|" * len(columns) + "\n"

    def cells(values):
        return "".join(f" {v:.1f} |" if pd.notna(v) else " - |" for v in values)

    lines = [f"| {label} |{cells(row)}" for label, row in frame.iterrows()]
    lines.append(f"| **total** |{cells(frame.sum())}")
    first = [compile_first_steps(run) for run in runs]
    if any(pd.notna(v) for v in first):
        lines.append(f"| of which the compile arm's first steps |{cells(first)}")
    return head + "\n".join(lines) + "\n"


def worker_startup(run: Path) -> str:
    """One run's worker processes, in seconds from the command's start (its "start-up and checks" phase; a run
    called in-process after another has none, and counts from "start workers and build models" instead)."""
    recorded = RunDir(run).read("run").iloc[0].get("startup_json")
    if not isinstance(recorded, str):
        return f"{run.name}: no startup_json in run.parquet (a run made before it was recorded)\n"
    phases = RunDir(run).read("phases")
    firsts = phases[phases.phase.isin(["start-up and checks", "start workers and build models"])]
    origin = firsts.sort_values("start_unix_ns").start_unix_ns.iloc[0]
    origin_phase = firsts.sort_values("start_unix_ns").phase.iloc[0]
    lines = [f"{run.name} (s from the start of {origin_phase!r}):",
             "| process | started | imports done | setup read | build began | built |", "|---|---:|---:|---:|---:|---:|"]
    for key, ages in json.loads(recorded).items():
        if ages.get("started_unix_ns") is None:
            lines.append(f"| {key} | - | - | - | - | - |")
            continue
        started = (ages["started_unix_ns"] - origin) / 1e9
        at = [started + ages[k] if ages.get(k) is not None else math.nan for k in ("imported", "setup", "build")]
        built = at[2] + ages["build_s"] if ages.get("build_s") is not None else math.nan
        lines.append(f"| {key} | {started:.1f} |" + "".join(f" {v:.1f} |" for v in (*at, built)))
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--by-workload", action="store_true")
    parser.add_argument("--workers", action="store_true", help="also each worker process's start-up")
    args = parser.parse_args(argv)
    missing = [str(r) for r in args.runs if not RunDir(r).has("phases")]
    if missing:
        print(f"phase_breakdown: no phases.parquet in {', '.join(missing)}", file=sys.stderr)
        return 2
    print(table(args.runs, args.by_workload), end="")
    if args.workers:
        for run in args.runs:
            print("\n" + worker_startup(run), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
