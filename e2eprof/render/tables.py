"""What a report says, read from a run directory's Parquet tables and turned into tables of formatted strings.

The HTML page and the markdown summary both render these, so a number can never read differently in the two.
Only pandas is needed: rendering a report must not import torch or re-run anything.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from e2eprof.analysis import verdict as v
from e2eprof.errors import UsageError
from e2eprof.tables.rundir import RunDir
from e2eprof.sweep import OOM_METRIC, OUT_OF_MEMORY

# Tables a report can use besides run.parquet; any of them may be missing (an early failure, a CPU run, --no-profile).
OPTIONAL_TABLES = ("summary", "steps", "correctness", "telemetry", "explain", "opdiff", "balance", "memory", "maxbatch",
                   "pairwise")
NOT_RECORDED = "not recorded in this run"

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
class Table:
    """Formatted cells; `numeric` marks right-aligned columns, `row_classes` lets HTML colour a row (e.g. 'fail')."""

    columns: list[str]
    rows: list[list[str]]
    numeric: set[int] = field(default_factory=set)
    row_classes: list[str] = field(default_factory=list)


@dataclass
class RunTables:
    """run.parquet's single row and every optional table that exists (None when the file is absent)."""

    run_dir: Path
    run: pd.Series
    tables: dict[str, pd.DataFrame | None]

    def get(self, name: str) -> pd.DataFrame | None:
        frame = self.tables.get(name)
        return frame if frame is not None and len(frame) else None

    def config(self) -> dict:
        return _json(self.run.get("config_json"))

    def environment(self) -> dict:
        return _json(self.run.get("environment_json"))

    def at(self, point: str) -> RunTables:
        """The same run seen at one sweep point: every table with a `point` column cut to that point's rows.

        Tables without the column (telemetry, a run from before sweeps) are kept whole.
        """
        tables = {name: frame[frame["point"] == point] if frame is not None and "point" in frame else frame
                  for name, frame in self.tables.items()}
        return RunTables(self.run_dir, self.run, tables)


def load_run(run_dir: Path) -> RunTables:
    """Read a report directory; UsageError when it is not one (no directory, no run.parquet, unreadable table)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir} is not a directory (expected a report directory written by `e2eprof compare`)")
    tables_dir = RunDir(run_dir)
    if not tables_dir.has("run"):
        raise UsageError(f"{run_dir} has no run.parquet: not a report directory written by `e2eprof compare`")
    run = _read(tables_dir, "run")
    if not len(run):
        raise UsageError(f"{run_dir / 'run.parquet'} has no rows")
    tables = {name: _read(tables_dir, name) if tables_dir.has(name) else None for name in OPTIONAL_TABLES}
    return RunTables(run_dir, run.iloc[0], tables)


def _read(run_dir: RunDir, name: str) -> pd.DataFrame:
    try:
        return run_dir.read(name)
    except Exception as exc:  # pyarrow raises several types for a truncated or foreign file
        raise UsageError(f"cannot read {run_dir.file(name)}: {type(exc).__name__}: {exc}") from None


def _json(text) -> dict:
    if not isinstance(text, str) or not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


# ---- number formatting (one place, shared by HTML and markdown) --------------------------------------------------


def missing(value) -> bool:
    return value is None or (not isinstance(value, str) and bool(pd.isna(value)))


def fmt_ms(value) -> str:
    """Milliseconds with about four significant digits: 407.5, 93.11, 5.123."""
    if missing(value):
        return "-"
    value = float(value)
    return f"{value:.1f}" if abs(value) >= 100 else f"{value:.2f}" if abs(value) >= 10 else f"{value:.3f}"


def fmt_ratio(ratio, low=None, high=None) -> str:
    """1.052x [1.046, 1.054]: the same form the terminal summary prints."""
    if missing(ratio):
        return "-"
    if missing(low) or missing(high):
        return f"{float(ratio):.3f}x"
    return f"{float(ratio):.3f}x [{float(low):.3f}, {float(high):.3f}]"


def fmt_num(value, spec: str = ".3g") -> str:
    return "-" if missing(value) else format(float(value), spec)


def fmt_time(unix_ns) -> str:
    if missing(unix_ns):
        return "-"
    return datetime.fromtimestamp(int(unix_ns) / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


# ---- verdicts ------------------------------------------------------------------------------------------------------


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


# ---- sweeps --------------------------------------------------------------------------------------------------------


def points(run: RunTables) -> list[str]:
    """The run's sweep points in the order it measured them; [] for a run from before sweeps.

    run.parquet's points_json comes first: it also lists points where nothing ran (every arm out of memory while
    building), which appear in no step table.
    """
    found: list[str] = []
    listed = run.run.get("points_json")
    if isinstance(listed, str) and listed:
        try:
            found = [str(p["point"]) for p in json.loads(listed) if isinstance(p, dict) and "point" in p]
        except json.JSONDecodeError:
            found = []
    for name in ("summary", "steps", "correctness", "memory"):
        frame = run.get(name)
        if frame is not None and "point" in frame:
            found += [str(p) for p in frame["point"].dropna()]
    return list(dict.fromkeys(found))


def is_sweep(run: RunTables) -> bool:
    """More than one point: every per-point number must then be shown apart, never pooled."""
    return len(points(run)) > 1


def has_points(run: RunTables) -> bool:
    """Written by a compare that knows sweeps (and so memory peaks), even with one point."""
    return bool(points(run))


def point_label(run: RunTables, point: str) -> str:
    """'b8-s1024-bf16: batch 8, seq 1024, bf16' from whichever table knows the point's columns."""
    for name in ("summary", "steps", "correctness", "memory"):
        frame = run.get(name)
        if frame is not None and {"point", "batch", "seq", "precision"} <= set(frame.columns):
            rows = frame[frame["point"] == point]
            if len(rows):
                r = rows.iloc[0]
                return f"{point}: batch {r['batch']}, seq {r['seq']}, {r['precision']}"
    return point


def sweep_line(run: RunTables) -> str:
    """'4 points: batch 1, 2 x seq 16, 32 x fp32' (or '' for a run of one point)."""
    names = points(run)
    if len(names) < 2:
        return ""
    config = run.config()
    axes = []
    for key, label in (("batch", "batch"), ("seq", "seq"), ("precision", "dtype")):
        value = config.get(key)
        values = value if isinstance(value, list) else [value]
        axes.append(f"{label} {', '.join(map(str, values))}")
    return f"sweep of {len(names)} points: " + " x ".join(axes)


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


# ---- memory ------------------------------------------------------------------------------------------------------

MEMORY_VALUES = (("peak_alloc_mb", "device alloc MB"), ("peak_reserved_mb", "device reserved MB"),
                 ("host_peak_rss_mb", "host peak RSS MB"))
MEMORY_PHASE = "timing"  # the phase summary.parquet's memory columns come from (e2eprof.analysis.summary.MEMORY_PHASE)


def _memory_peaks(run: RunTables) -> pd.DataFrame | None:
    """Timed-phase peaks per (point, workload, arm): memory.parquet's timing rows, else the summary's columns."""
    memory = run.get("memory")
    if memory is not None and "phase" in memory:
        timed = memory[memory["phase"] == MEMORY_PHASE]
        if len(timed):
            return timed
    summary = run.get("summary")
    if summary is not None and any(c in summary for c, _ in MEMORY_VALUES):
        measured = summary[[c for c, _ in MEMORY_VALUES if c in summary]].notna().any(axis=1)
        return summary[measured] if measured.any() else None
    return None


def memory_table(run: RunTables) -> Table | None:
    """Peak memory of the timed steps per (point, workload, arm), the largest phase, and out-of-memory arms."""
    peaks = _memory_peaks(run)
    checks = run.get("correctness")
    oom = checks[checks["metric"] == OOM_METRIC] if checks is not None and "metric" in checks else None
    if peaks is None and (oom is None or not len(oom)):
        return None
    sweep = is_sweep(run)
    shown = [(c, label) for c, label in MEMORY_VALUES if peaks is not None and c in peaks and peaks[c].notna().any()]
    # Compare arms on device memory where it was measured, else on host memory (a CPU run).
    basis = next((c for c, _ in shown if c == "peak_alloc_mb"), "host_peak_rss_mb")
    basis_label = dict(MEMORY_VALUES)[basis]
    versus = [f"{basis_label.split(' MB')[0]} vs baseline"] if shown else []
    columns = [*(["point"] if sweep else []), "workload", "arm", *[label for _, label in shown], *versus,
               "largest phase" if shown else "out of memory"]
    memory = run.get("memory")
    body, classes = [], []
    for _, r in (peaks.iterrows() if peaks is not None else iter(())):
        here = _same_cell(peaks, r)
        base = here[here["arm"] == "baseline"]
        base_value = float(base[basis].iloc[0]) if len(base) and basis in base and not missing(base[basis].iloc[0]) else None
        value = r.get(basis)
        vs = "-" if base_value in (None, 0) or missing(value) or r["arm"] == "baseline" else f"{(float(value) / base_value - 1) * 100:+.1f}%"
        body.append([*([str(r["point"])] if sweep else []), str(r["workload"]), str(r["arm"]),
                     *[fmt_num(r.get(c), ".1f") for c, _ in shown], vs, _largest_phase(memory, r, basis)])
        classes.append("")
    for _, r in (oom.iterrows() if oom is not None else iter(())):
        body.append([*([str(r.get("point", ""))] if sweep else []), str(r["workload"]), str(r["arm"]),
                     *["out of memory"] * len(shown), *["-"] * len(versus), str(r.get("detail") or "")])
        classes.append("fail")
    return Table(columns, body, numeric=set(range(2 + sweep, len(columns) - 1)), row_classes=classes)


def _same_cell(frame: pd.DataFrame, row: pd.Series) -> pd.DataFrame:
    """The rows of `frame` at the same point and workload as `row`."""
    mine = frame[frame["workload"] == row["workload"]]
    return mine[mine["point"] == row["point"]] if "point" in frame and "point" in row else mine


def _largest_phase(memory: pd.DataFrame | None, row: pd.Series, column: str) -> str:
    """'correctness: 812.3' : the phase of this arm with the highest peak, from memory.parquet."""
    if memory is None or column not in memory:
        return "-"
    mine = _same_cell(memory, row)
    mine = mine[(mine["arm"] == row["arm"]) & mine[column].notna()]
    if not len(mine):
        return "-"
    top = mine.loc[mine[column].idxmax()]
    return f"{top['phase']}: {float(top[column]):.1f}"


def memory_notes(run: RunTables) -> list[str]:
    """What the memory numbers mean on this run: device stats or host only, per-phase or process-lifetime peaks."""
    notes = []
    peaks = _memory_peaks(run)
    if peaks is None:
        notes.append(f"Peaks: {NOT_RECORDED}; only the arms that ran out of memory are known.")
    if peaks is not None and "peak_alloc_mb" in peaks and not peaks["peak_alloc_mb"].notna().any():
        notes.append("Device memory: not measured (no CUDA device); arms are compared on host peak RSS.")
    memory = run.get("memory")
    if memory is not None and "host_rss_scope" in memory and (memory["host_rss_scope"] == "process").any():
        notes.append("Host RSS here is the process-lifetime peak (this system cannot reset it per phase).")
    return notes


def maxbatch_table(run: RunTables) -> Table | None:
    """--find-max-batch: per (seq, dtype) and arm the largest batch that ran and the first that did not."""
    table = run.get("maxbatch")
    if table is None:
        return None
    body = []
    for _, r in table.iterrows():
        best = "-" if missing(r.get("max_batch")) else f"{int(r['max_batch'])}" + (" (cap)" if bool(r.get("capped")) else "")
        first = "-" if missing(r.get("smallest_failed")) else str(int(r["smallest_failed"]))
        body.append([str(r.get("seq")), str(r.get("precision")), str(r["arm"]), best, first,
                     "-" if missing(r.get("probes")) else str(int(r["probes"])),
                     fmt_num(r.get("peak_alloc_mb_at_max"), ".0f"), str(r.get("detail") or "")])
    return Table(["seq", "dtype", "arm", "max batch", "first failure", "probes", "peak alloc MB at max", "detail"],
                 body, numeric={0, 3, 4, 5, 6})


def maxbatch_lines(run: RunTables) -> list[str]:
    """'seq 16, fp32: patched fits batch 12, baseline 6 (2.00x)' where the two arms differ."""
    table = run.get("maxbatch")
    if table is None:
        return []
    lines = []
    for (seq, precision), rows in table.groupby(["seq", "precision"], sort=False):
        found = dict(zip(rows["arm"], rows["max_batch"]))
        base, patched = found.get("baseline"), found.get("patched")
        if missing(base) or missing(patched) or not base or base == patched:
            continue
        lines.append(f"seq {seq}, {precision}: patched fits batch {int(patched)}, baseline {int(base)} "
                     f"({float(patched) / float(base):.2f}x)")
    return lines


# ---- speedups ------------------------------------------------------------------------------------------------------


def reference_arms(summary: pd.DataFrame) -> list[str]:
    """Stock reference arms the patched arm is compared against: each `speedup_vs_<arm>` with `<arm>_ci_low`
    beside it, except baseline (whose interval columns are plain ci_low/ci_high). A column with no value at all
    is left out: write_table adds the sdpa columns to every summary, also to runs without an sdpa arm."""
    found = [m.group(1) for c in summary.columns if (m := re.fullmatch(r"speedup_vs_(\w+)", c))]
    return [arm for arm in found if arm != "baseline" and f"{arm}_ci_low" in summary.columns
            and summary[f"speedup_vs_{arm}"].notna().any()]


def confidence_label(run: RunTables) -> str:
    confidence = run.config().get("confidence")
    return f"{float(confidence) * 100:.0f}% CI" if isinstance(confidence, (int, float)) else "CI"


def speedup_table(run: RunTables, workload: str) -> Table:
    """Per arm: samples, median and spread, cold step, speedup vs baseline and vs each stock reference arm."""
    summary = run.get("summary")
    rows = summary[summary["workload"] == workload]
    refs = reference_arms(summary)
    ci = confidence_label(run)
    has_decode = "tpot_median_ms" in rows and rows["tpot_median_ms"].notna().any()
    columns = ["arm", "n", "median ms", "p10 / p90 ms", "cold ms", f"vs baseline [{ci}]",
               *[f"vs {ref} [{ci}]" for ref in refs], *(["TTFT ms", "ms / token"] if has_decode else []), "correct"]
    body = []
    for _, r in rows.iterrows():
        arm = str(r["arm"])
        vs_base = "1 (reference)" if arm == "baseline" else fmt_ratio(r.get("speedup_vs_baseline"), r.get("ci_low"), r.get("ci_high"))
        vs_refs = [fmt_ratio(r.get(f"speedup_vs_{ref}"), r.get(f"{ref}_ci_low"), r.get(f"{ref}_ci_high")) for ref in refs]
        decode = [fmt_ms(r.get("ttft_median_ms")), fmt_ms(r.get("tpot_median_ms"))] if has_decode else []
        correct = "-" if missing(r.get("correct")) else ("yes" if bool(r.get("correct")) else "NO")
        n = "-" if missing(r.get("n")) else str(int(r["n"]))
        body.append([arm, n, fmt_ms(r.get("median_ms")), f"{fmt_ms(r.get('p10_ms'))} / {fmt_ms(r.get('p90_ms'))}",
                     fmt_ms(r.get("cold_ms")), vs_base, *vs_refs, *decode, correct])
    return Table(columns, body, numeric=set(range(1, len(columns) - 1)),
                 row_classes=["fail" if row[-1] == "NO" else "" for row in body])


def workloads(run: RunTables) -> list[str]:
    """Workloads in the order the run measured them."""
    for name in ("summary", "steps"):
        frame = run.get(name)
        if frame is not None:
            return list(dict.fromkeys(frame["workload"].astype(str)))
    return [str(w) for w in run.config().get("workloads", [])]


def arms(run: RunTables) -> list[str]:
    """Arms in a fixed order (summary first, then any only seen in steps) so every plot colours them alike."""
    names: list[str] = []
    for name in ("summary", "steps"):
        frame = run.get(name)
        if frame is not None:
            names += [a for a in dict.fromkeys(frame["arm"].astype(str)) if a not in names]
    return names


# ---- Amdahl explanation --------------------------------------------------------------------------------------------


def amdahl_table(run: RunTables) -> Table | None:
    """Per workload: the replaced region's share f and speedup s, predicted and bound, measured, cause."""
    explain = run.get("explain")
    if explain is None:
        return None
    summary = run.get("summary")
    columns = ["workload", "time basis", "share f", "speedup s", "predicted", "bound 1/(1-f)", "measured", "cause"]
    body = []
    for _, r in explain.iterrows():
        measured = fmt_ratio(r.get("measured"))
        if summary is not None:  # the measured ratio's interval lives in the summary
            patched = summary[(summary["workload"] == r["workload"]) & (summary["arm"] == "patched")]
            if len(patched):
                p = patched.iloc[0]
                measured = fmt_ratio(p.get("speedup_vs_baseline"), p.get("ci_low"), p.get("ci_high"))
        share = "-" if missing(r.get("f")) else f"{float(r['f']) * 100:.1f}%"
        body.append([str(r["workload"]), str(r.get("time_basis") or "-"), share, fmt_ratio(r.get("s")),
                     fmt_ratio(r.get("predicted")), fmt_ratio(r.get("bound")), measured, str(r.get("cause") or "-")])
    return Table(columns, body, numeric={2, 3, 4, 5, 6})


def amdahl_details(run: RunTables) -> list[tuple[str, str]]:
    explain = run.get("explain")
    if explain is None or "detail" not in explain:
        return []
    return [(str(r["workload"]), str(r["detail"])) for _, r in explain.iterrows() if not missing(r["detail"])]


# ---- arm balance ---------------------------------------------------------------------------------------------------


def balance_table(run: RunTables) -> Table | None:
    """Median SM clock and GPU temperature per arm against the baseline's, as the verdict checked them."""
    balance = run.get("balance")
    if balance is None:
        return None
    sweep = "point" in balance and balance["point"].nunique() > 1
    columns = [*(["point"] if sweep else []), "workload", "arm", "steps with telemetry", "SM clock MHz",
               "clock vs baseline", "GPU temp C", "temp vs baseline", "throttled share", "flags"]
    body, classes = [], []
    for _, r in balance.iterrows():
        flags = [name for name in ("clock_imbalance", "temp_imbalance", "throttled") if bool(r.get(name) or False)]
        clock = "-" if missing(r.get("clock_diff_rel")) else f"{float(r['clock_diff_rel']) * 100:+.1f}%"
        temp = "-" if missing(r.get("temp_diff_c")) else f"{float(r['temp_diff_c']):+.1f} C"
        share = "-" if missing(r.get("throttled_share")) else f"{float(r['throttled_share']) * 100:.0f}%"
        body.append([*([str(r["point"])] if sweep else []), str(r["workload"]), str(r["arm"]),
                     f"{r.get('steps_with_telemetry', '-')}/{r.get('steps', '-')}",
                     fmt_num(r.get("sm_clock_median_mhz"), ".0f"), clock, fmt_num(r.get("gpu_temp_median_c"), ".0f"),
                     temp, share, ", ".join(flags) or "none"])
        classes.append("fail" if flags else "")
    return Table(columns, body, numeric={i + sweep for i in (2, 3, 4, 5, 6, 7)}, row_classes=classes)


# ---- correctness ---------------------------------------------------------------------------------------------------


def correctness_failures(run: RunTables, limit: int = 50) -> tuple[Table | None, int]:
    """Failed checks (at most `limit` rows) and how many failed in all."""
    checks = run.get("correctness")
    if checks is None:
        return None, 0
    failed = checks[~checks["passed"].fillna(False).astype(bool)]
    body = [[str(r["workload"]), str(r["arm"]), str(r["tensor"]), str(r["metric"]), fmt_num(r.get("value")),
             fmt_num(r.get("tolerance")), str(r.get("detail") or "")] for _, r in failed.head(limit).iterrows()]
    table = Table(["workload", "arm", "tensor", "metric", "value", "tolerance", "detail"], body, numeric={4, 5},
                  row_classes=["fail"] * len(body))
    return table, len(failed)


def correctness_counts(run: RunTables) -> Table | None:
    """Checks passed / run per workload (rows) and arm (columns)."""
    checks = run.get("correctness")
    if checks is None:
        return None
    passed = checks.assign(ok=checks["passed"].fillna(False).astype(bool))
    arm_names = [a for a in arms(run) if a in set(passed["arm"])] + sorted(set(passed["arm"]) - set(arms(run)))
    body, classes = [], []
    for workload, rows in passed.groupby("workload", sort=False):
        cells = []
        for arm in arm_names:
            mine = rows[rows["arm"] == arm]
            cells.append(f"{int(mine['ok'].sum())}/{len(mine)}" if len(mine) else "-")
        body.append([str(workload), *cells])
        classes.append("" if rows["ok"].all() else "fail")
    return Table(["workload", *[f"{a} passed" for a in arm_names]], body, numeric=set(range(1, len(arm_names) + 1)),
                 row_classes=classes)


# ---- environment ---------------------------------------------------------------------------------------------------


def run_facts(run: RunTables) -> list[tuple[str, str]]:
    """What was run, when, with which patch: the facts a reader needs to reproduce or trust the run."""
    r = run.run
    model = _json(r.get("model_json"))
    facts = [
        ("run id", str(r.get("run_id"))), ("status", str(r.get("status"))),
        ("started", fmt_time(r.get("started_unix_ns"))), ("ended", fmt_time(r.get("ended_unix_ns"))),
        ("command line", str(r.get("command_line") or "-")),
        ("patch", f"{r.get('patch_spec')} (origin: {r.get('patch_origin')})"),
        ("patch source sha256", str(r.get("patch_source_sha256") or "-")),
        ("seed", str(r.get("seed"))), ("batch digest", str(r.get("batch_digest") or "-")),
    ]
    if model:
        facts.append(("model", ", ".join(f"{k}={val}" for k, val in sorted(model.items()))))
    if not missing(r.get("failure")):
        facts.append(("failure", str(r.get("failure"))))
    if "telemetry_available" in r and not missing(r.get("telemetry_available")) and not bool(r.get("telemetry_available")):
        facts.append(("telemetry", f"unavailable: {r.get('telemetry_unavailable_reason') or 'no reason recorded'}"))
    return facts


def flatten(mapping: dict, prefix: str = "") -> list[tuple[str, str]]:
    """Nested JSON as sorted dotted keys: env_vars.CUDA_VISIBLE_DEVICES = 0."""
    out = []
    for key in sorted(mapping):
        value = mapping[key]
        if isinstance(value, dict) and value:
            out += flatten(value, f"{prefix}{key}.")
        else:
            text = ", ".join(map(str, value)) if isinstance(value, list) else ("-" if value is None else str(value))
            out.append((f"{prefix}{key}", text))
    return out


def telemetry_note(run: RunTables) -> str:
    reason = run.run.get("telemetry_unavailable_reason")
    return NOT_RECORDED + ("" if missing(reason) else f" ({reason})")


def title(run: RunTables) -> str:
    config = run.config()
    return f"{config.get('model', '?')} + {run.run.get('patch_spec') or config.get('patch', '?')}"


def device_line(run: RunTables) -> str:
    env = run.environment()
    device = env.get("gpu_name") or env.get("cpu_model") or env.get("device") or "unknown device"
    versions = ", ".join(f"{k} {env[k]}" for k in ("torch", "transformers", "triton") if env.get(k))
    return f"{device}" + (f"; {versions}" if versions else "")
