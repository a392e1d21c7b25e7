"""What a run concluded, as a report shows it: the verdict signed per (point, workload), the run's overall verdict and
exit code, what each reason code means, and the grid of verdicts across a sweep's points.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from e2eprof.analysis import verdict as v
from e2eprof.render.run_tables import RunTables, _json, fmt_ratio, is_sweep, missing, points, workloads
from e2eprof.sweep import OUT_OF_MEMORY


# One line per reason code, for readers who do not know the codes by heart (meanings as in README "Verdicts").
REASON_MEANING = {
    v.FASTER: "the speedup interval's lower bound is above 1 + the margin",
    v.SLOWER: "the whole speedup interval is below 1",
    v.INCORRECT: "the patched arm failed a correctness check against fp64",
    v.KERNEL_NOT_RUN: "no proof the custom kernel ran in the patched arm (call counters or profile trace)",
    v.BASELINE_CONTAMINATED: "a stock arm ran the custom kernel",
    v.ARM_FAILED: "the baseline or patched arm crashed",
    v.BELOW_MARGIN: "faster, but the interval's lower bound is under 1 + the margin",
    v.NO_SIGNIFICANT_DIFFERENCE: "the interval contains 1: more steps would be needed to resolve a difference",
    v.TOO_FEW_SAMPLES: "too few timed steps per arm for a verdict",
    v.CLOCK_IMBALANCE: "arms ran at SM clocks more than 2% apart",
    v.THERMAL_IMBALANCE: "arms ran at GPU temperatures more than 5 C apart",
    v.THROTTLED: "some steps were throttled",
    # Literals, not constants: these codes are newer than some report directories a reader may render.
    "NOT_SIGNIFICANT_AFTER_CORRECTION": "the interval excludes 1, but the rank test is not significant once every "
                                        "workload of the run is counted",
    "AA_FALSE_ALARM": "A/A run: two identical stock arms came out different, so this machine's timings cannot be trusted",
    OUT_OF_MEMORY: "the baseline or the arm under test ran out of memory at this point: nothing was timed there",
}


@dataclass
class WorkloadVerdict:
    workload: str
    arm: str  # the arm under test: patched, or the second baseline of an A/A run
    verdict: str
    reasons: list[str]
    speedup: str  # that arm vs baseline, with its interval
    advice: str = ""
    point: str = ""  # the sweep point it was signed at ("" in a run from before sweeps)

    @property
    def out_of_memory(self) -> bool:
        return OUT_OF_MEMORY in self.reasons


def workload_verdicts(run: RunTables) -> list[WorkloadVerdict]:
    """The verdict compare signed for each (point, workload), stored on the row of the arm under test."""
    summary = run.get("summary")
    if summary is None or "verdict" not in summary:
        return []
    keys = ["point", "workload"] if "point" in summary else ["workload"]
    out = []
    for key, rows in summary.groupby(keys, sort=False):
        point, workload = key if len(keys) == 2 else ("", key[0] if isinstance(key, tuple) else key)
        signed = rows[rows["verdict"].notna()]
        if not len(signed):
            continue
        patched = signed[signed["arm"] == "patched"]
        # Several candidates (a "candidate" column): one verdict each; else the arm under test's.
        several = "candidate" in signed and signed["candidate"].notna().any()
        for _, row in (signed if several else (patched if len(patched) else signed).iloc[:1]).iterrows():
            reasons = [r for r in str(row.get("reasons") or "").split(",") if r]
            advice = "" if missing(row.get("advice")) else str(row.get("advice"))
            out.append(WorkloadVerdict(str(workload), str(row["arm"]), str(row["verdict"]), reasons,
                                       fmt_ratio(row.get("speedup_vs_baseline"), row.get("ci_low"), row.get("ci_high")),
                                       advice, str(point)))
    return out


def candidates(run: RunTables) -> dict | None:
    """Several candidates: the ranking compare recorded (run.parquet's candidates_json), or None."""
    found = _json(run.run.get("candidates_json"))
    return found or None


def overall_verdict(run: RunTables, verdicts: list[WorkloadVerdict]) -> tuple[str, int]:
    """The run's worst verdict and the exit code compare gave it (4 failed, 130 interrupted, as in cli.py)."""
    status = str(run.run.get("status") or "")
    worst = v.worst([w.verdict for w in verdicts if w.verdict in v.SEVERITY])
    if candidates(run) and run.run.get("verdict") in v.SEVERITY:  # several candidates: the policy compare applied
        worst = str(run.run["verdict"])
    if status == "failed":
        return worst, 4
    if status == "interrupted":
        return worst, 130
    return worst, v.EXIT_CODES[worst]


def verdict_grid(run: RunTables) -> tuple[list[str], list[str], dict[tuple[str, str], WorkloadVerdict]]:
    """Points (rows), workloads (columns) and the verdict signed in each cell."""
    verdicts = workload_verdicts(run)
    cells = {(w.point, w.workload): w for w in verdicts}
    rows = [p for p in points(run) if any(w.point == p for w in verdicts)]
    rows += [p for p in dict.fromkeys(w.point for w in verdicts) if p not in rows]
    columns = [w for w in workloads(run) if any(v.workload == w for v in verdicts)]
    return rows, columns, cells


def grid_cell_text(verdict: WorkloadVerdict | None) -> str:
    """One cell of the grid as plain text: verdict, speedup [CI] and reasons, or that memory ran out."""
    if verdict is None:
        return "-"
    if verdict.out_of_memory:
        return f"OUT OF MEMORY ({verdict.verdict})"
    reasons = ", ".join(r for r in verdict.reasons if r != verdict.verdict)
    return f"{verdict.verdict} {verdict.speedup}" + (f" ({reasons})" if reasons else "")


def mixed_direction(verdicts: list[WorkloadVerdict]) -> str:
    """'faster at b1-s16-fp32/infer, slower at b8-s1024-bf16/infer' when the sweep points disagree, else ''."""
    faster = [f"{w.point}/{w.workload}" for w in verdicts if v.FASTER in w.reasons]
    slower = [f"{w.point}/{w.workload}" for w in verdicts if v.SLOWER in w.reasons]
    if not faster or not slower:
        return ""
    return (f"The kernel is significantly faster at {', '.join(faster)} and slower at {', '.join(slower)}: "
            "its benefit depends on the shape.")


def sweep_speedups(run: RunTables) -> pd.DataFrame | None:
    """The arm under test's speedup and interval per (point, workload), for the sweep plot; None without a sweep."""
    summary = run.get("summary")
    if summary is None or "point" not in summary or not is_sweep(run) or "verdict" not in summary:
        return None
    signed = summary[summary["verdict"].notna()]
    columns = ["point", "workload", "arm", "speedup_vs_baseline", "ci_low", "ci_high", "verdict", "reasons"]
    return signed[[c for c in columns if c in signed]] if len(signed) else None
