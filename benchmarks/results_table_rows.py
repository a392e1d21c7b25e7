"""README results-table rows from compare run directories, so the published figures are read from the runs.

For each RUN_DIR, one markdown row per workload of the patched arm: predicted (Amdahl) and measured step speedup
with its 95% interval, the verdict, and the patched arm against each stock reference with its interval. A run of
several candidates (`--patch a --patch b`) gives one row per candidate and workload, the candidate named first.
When the sdpa arm was asked for but not built, the baseline already is stock SDPA (the runner builds none then),
so "vs SDPA" is the measured speedup itself, and the row says so; a run that did not ask for it says "no sdpa
arm". A workload a reference sits out shows "-", as does a prediction of a run without a profile.
Usage: python3 benchmarks/results_table_rows.py RUN_DIR...
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pandas as pd

from e2eprof.tables.rundir import RunDir


def _x(value: float) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3f}x"


def _with_interval(value: float, low: float, high: float) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.3f}x [{low:.3f}, {high:.3f}]" if not math.isnan(low) else _x(value)


_COLUMNS = ("workload", "verdict", "reasons", "speedup_vs_baseline", "ci_low", "ci_high", "predicted_speedup",
            "speedup_vs_sdpa", "sdpa_ci_low", "sdpa_ci_high", "speedup_vs_compile", "compile_ci_low", "compile_ci_high")


def _candidate_arms(summary: pd.DataFrame) -> list[str]:
    """A run of several candidates names each one's arm "patched:<candidate>"; a plain run has none."""
    return sorted({a for a in summary.arm if a.startswith("patched:")})


def rows(run_dir: Path) -> list[str]:
    summary = RunDir(run_dir).read("summary")
    arms = set(summary.arm)
    run = RunDir(run_dir).read("run").iloc[0]
    asked = json.loads(run.config_json).get("reference_arms") or []
    checks = RunDir(run_dir).read_if_present("correctness")
    # An sdpa arm that was built and then failed (out of memory, say) has correctness rows; one never built has none.
    sdpa_failed = checks is not None and bool(((checks.arm == "sdpa") & checks.metric.isin(["arm_failed", "oom"])).any())
    candidates = _candidate_arms(summary)
    out = []
    for record in summary[summary.arm.isin(candidates or ["patched"])].to_dict("records"):
        # Columns a run may lack: an unprofiled run has no prediction, an older one no compile columns.
        r = {k: record.get(k, math.nan) for k in _COLUMNS}
        verdict = f"{r['verdict']} ({r['reasons']})" if isinstance(r["reasons"], str) and r["reasons"] else str(r["verdict"])
        measured = _with_interval(r["speedup_vs_baseline"], r["ci_low"], r["ci_high"])
        if "sdpa" in arms:
            vs_sdpa = _with_interval(r["speedup_vs_sdpa"], r["sdpa_ci_low"], r["sdpa_ci_high"])
        elif sdpa_failed:
            vs_sdpa = "sdpa arm failed"
        elif "sdpa" in asked:  # asked for but not built: the runner builds none when the baseline already is SDPA
            vs_sdpa = measured if measured == "-" else f"{measured} (baseline is stock SDPA)"
        else:
            vs_sdpa = "no sdpa arm"
        if "compile" in arms:
            vs_compile = _with_interval(r["speedup_vs_compile"], r["compile_ci_low"], r["compile_ci_high"])
        else:
            vs_compile = "no compile arm"
        named = f"| {record['arm'].split(':', 1)[1]} " if candidates else ""
        out.append(f"{named}| {r['workload']} | {_x(r['predicted_speedup'])} | {measured} | {verdict} | {vs_sdpa} | {vs_compile} |")
    return out


def main(run_dirs: list[str]) -> int:
    if not run_dirs:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    for name in run_dirs:
        path = Path(name)
        if not (path / "summary.parquet").exists():
            print(f"error: {path} has no summary.parquet (not a finished compare run)", file=sys.stderr)
            return 2
        lines = rows(path)
        several = bool(_candidate_arms(RunDir(path).read("summary")))  # a candidate column before the workload
        print(f"{path.name}:")
        print(("| candidate " if several else "") + "| workload | predicted | measured [95% CI] | verdict | patched vs SDPA | patched vs compile |")
        print(("|---" if several else "") + "|---|---|---|---|---|---|")
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
