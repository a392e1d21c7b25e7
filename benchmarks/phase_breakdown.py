"""Where each run's own time went, side by side: phases.parquet of one or more run folders as one markdown table.

One column per run (its folder name), one row per phase summed over the run's workloads (start-up and checks, start
workers and build models, cold step, correctness, warm-up, timing, revalidation, profile, stop workers, summary and
tables), then the total, then the compile arm's first steps (from steps.parquet: what its cold steps hold of the
run). --by-workload splits the per-workload phases by workload as well.

Usage: python3 benchmarks/phase_breakdown.py RUN_DIR [RUN_DIR ...] [--by-workload]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from e2eprof.tables.rundir import RunDir

ORDER = ("start-up and checks", "start workers and build models", "cold step", "correctness", "warm-up", "timing",
         "revalidation", "profile", "stop workers", "summary and tables")


def phase_seconds(run: Path, by_workload: bool) -> pd.Series:
    """Seconds per phase (or per (phase, workload)) of one run, in the order the run goes through them."""
    phases = RunDir(run).read("phases")
    keys = ["phase", "workload"] if by_workload else ["phase"]
    seconds = phases.groupby(keys, sort=False).seconds.sum()
    rank = {name: i for i, name in enumerate(ORDER)}
    workloads = {w: i for i, w in enumerate(dict.fromkeys(phases.workload))}

    def position(key):
        phase, workload = (key, "*") if not by_workload else key
        return rank.get(phase, len(ORDER)), workloads.get(workload, 0)

    return seconds.reindex(sorted(seconds.index, key=position))


def compile_first_steps(run: Path) -> float | None:
    """Seconds of the compile arm's cold steps, all workloads together (None: the run had no compile arm)."""
    if not RunDir(run).has("steps"):  # a report that kept only some tables
        return None
    steps = RunDir(run).read("steps")
    cold = steps[(steps.phase == "cold") & (steps.arm == "compile")]
    return float(cold.wall_ns.sum() / 1e9) if len(cold) else None


def table(runs: list[Path], by_workload: bool = False) -> str:
    columns = {run.name: phase_seconds(run, by_workload) for run in runs}
    frame = pd.DataFrame(columns)
    names = list(columns)
    head = "| phase |" + "".join(f" {n} s |" for n in names) + "\n|---|" + "---:|" * len(names) + "\n"

    def label(key):
        return f"{key[0]} ({key[1]})" if isinstance(key, tuple) and key[1] != "*" else (key[0] if isinstance(key, tuple) else key)

    def cells(values):
        return "".join(f" {v:.1f} |" if pd.notna(v) else " - |" for v in values)

    lines = [f"| {label(key)} |{cells(row)}" for key, row in frame.iterrows()]
    lines.append(f"| **total** |{cells(frame.sum())}")
    first = [compile_first_steps(run) for run in runs]
    if any(v is not None for v in first):
        lines.append(f"| of which the compile arm's first steps |{cells([v if v is not None else float('nan') for v in first])}")
    return head + "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--by-workload", action="store_true")
    args = parser.parse_args(argv)
    missing = [str(r) for r in args.runs if not RunDir(r).has("phases")]
    if missing:
        print(f"phase_breakdown: no phases.parquet in {', '.join(missing)}", file=sys.stderr)
        return 2
    print(table(args.runs, args.by_workload), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
