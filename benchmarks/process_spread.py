"""How far identical worker processes land apart, with and without worker isolation (e2eprof.harness.isolation).

One A/A run (`e2eprof calibrate`) per (workload, isolation setting), with many processes of the same stock arm
(--replicas R: 2R processes), gives per-process medians directly: their spread is the process noise a compare run
carries, and what isolation is for. The summary's own estimate (process_noise_estimate, with its degrees of
freedom) is reported beside the raw per-process medians.

    python3 benchmarks/process_spread.py OUT_DIR --model gpt2 --workload decode,generate --isolate none,all \
        [--replicas 4] [--budget 15] [--deadline 540] [-- extra calibrate options]

Writes OUT_DIR/process_spread.parquet (one row per run) and OUT_DIR/process_spread.md; each run's report directory
stays under OUT_DIR/runs/. Runs on any machine; runs that would start past --deadline seconds are skipped.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from e2eprof.tables.rundir import RunDir


def one_run(out: Path, model: str, workload: str, isolate: str, replicas: int, budget: float, extra: list[str]) -> dict:
    name = f"{model}-{workload}-isolate-{isolate.replace(',', '+')}"
    run_dir = out / "runs" / name
    command = [sys.executable, "-m", "e2eprof", "calibrate", "--model", model, "--workload", workload,
               "--replicas", str(replicas), "--isolate", isolate, "--budget", str(budget), "--out", str(run_dir),
               "--force", *extra]
    started = time.time()
    (out / "runs").mkdir(parents=True, exist_ok=True)
    done = subprocess.run(command, capture_output=True, text=True)
    (out / "runs" / f"{name}.log").write_text(" ".join(command) + "\n" + done.stdout + done.stderr)
    row = {"model": model, "workload": workload, "isolate": isolate, "replicas": replicas, "exit_code": done.returncode,
           "wall_s": time.time() - started}
    try:
        steps = RunDir(run_dir).read("steps")
        summary = RunDir(run_dir).read("summary")
    except (FileNotFoundError, OSError):
        return row | {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    warm = steps[(steps.phase == "warm") & (steps.workload == workload)]
    medians = warm.groupby(["arm", "replica"]).wall_ns.median() / 1e6  # ms per (arm, process)
    logs = np.log(medians.to_numpy())
    candidate = summary[summary.verdict.notna()].iloc[0]
    run = RunDir(run_dir).read("run").iloc[0]
    return row | {
        "processes": int(len(medians)),
        "median_ms": float(np.median(medians)),
        "per_process_ms": json.dumps([round(float(m), 3) for m in medians]),
        # spread of one process's log median around the others': the per-process offset's SD
        "process_sd": float(np.std(logs, ddof=1)) if len(logs) > 1 else math.nan,
        "max_over_min": float(medians.max() / medians.min()),
        "process_noise_estimate": float(candidate.get("process_noise_estimate", math.nan)),
        "process_noise_df": float(candidate.get("process_noise_df", math.nan)),
        "replicas_disagree_p": float(candidate.get("replicas_disagree_p", math.nan)),
        "speedup": float(candidate.speedup_vs_baseline), "ci_low": float(candidate.ci_low),
        "ci_high": float(candidate.ci_high), "verdict": f"{candidate.verdict} ({candidate.reasons})",
        "isolation_json": run.get("isolation_json"), "error": "",
    }


def markdown(table: pd.DataFrame, command: str) -> str:
    lines = ["# Spread between identical processes, with and without worker isolation", "",
             f"`{command}`", "",
             "| model | workload | isolate | processes | median ms | per-process SD | max/min | estimate (df) | A/A verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in table.itertuples():
        if getattr(r, "error", ""):
            lines.append(f"| {r.model} | {r.workload} | {r.isolate} | - | - | - | - | - | {r.error} |")
            continue
        lines.append(f"| {r.model} | {r.workload} | {r.isolate} | {r.processes} | {r.median_ms:.2f} | "
                     f"{r.process_sd:.2%} | {r.max_over_min:.3f} | {r.process_noise_estimate:.2%} "
                     f"({r.process_noise_df:.0f}) | {r.verdict} |")
    lines += ["", "per-process SD: the standard deviation of the processes' log medians (all 2R processes, both "
              "'arms'); estimate: the summary's process noise (a ratio of two single processes, so about sqrt(2) "
              "times the per-process SD), beyond what the steps explain."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--workload", default="decode,generate")
    parser.add_argument("--isolate", default="none,all", help="isolation settings separated by ';' or ',' "
                        "(a setting with several parts: cores+threads)")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--budget", type=float, default=15.0)
    parser.add_argument("--deadline", type=float, default=math.inf, help="no run starts after this many seconds")
    args, extra = parser.parse_known_args()
    extra = [e for e in extra if e != "--"]
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    settings = [s.replace("+", ",") for s in args.isolate.replace(";", ",").split(",")]
    rows = []
    for workload in args.workload.split(","):
        for isolate in settings:
            if time.time() - started > args.deadline:
                rows.append({"model": args.model, "workload": workload, "isolate": isolate, "error": "skipped: deadline"})
                continue
            rows.append(one_run(args.out, args.model, workload, isolate, args.replicas, args.budget, extra))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "isolation_json"}), flush=True)
            table = pd.DataFrame(rows)
            table.to_parquet(args.out / "process_spread.parquet", index=False)
            (args.out / "process_spread.md").write_text(markdown(table, " ".join(sys.argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
