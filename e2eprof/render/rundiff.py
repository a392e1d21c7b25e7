"""`diff`: compare two report directories of the same comparison, e.g. before and after a driver or kernel change.

The two runs are independent samples (different processes, often different days or cards), so nothing is paired
across them: every interval here resamples run A and run B independently. Rows come from diff_rows, the runs and
what changed between them from diff_records and diff_changes.

Per (workload, arm) present in both runs: median A, median B, the time ratio B/A (above 1: B is slower) with a
bootstrap interval, a Mann-Whitney p-value Holm-adjusted over all those rows, and a status. Per workload: the
kernel's speedup (baseline / patched median) in A and in B, and the interval of their difference. Every interval is
widened by the runs' process noise (stats.with_process_noise; a run from before the setting gets its device's
default): A and B ran in other processes, and identical processes differ.

Sweeps: when either run covers several (batch, seq, precision) points, rows are keyed by (point, workload, arm) and
numbers of different points are never pooled. Runs whose grids share no point are not the same comparison; runs
whose grids overlap are diffed on the common points and the rest is flagged. An arm that fitted in A but ran out of
memory in B is a regression (OUT_OF_MEMORY_IN_B).

A change counts only when it is significant (Holm-adjusted p <= 1 - confidence and the interval excludes "no
change") and its whole interval lies beyond the margin ``min_change``, the same rule `compare` uses for PASS; a
significant change whose interval reaches inside the margin is BELOW_MARGIN. Exit code 1 when anything got worse
that way, else 0.
"""

from __future__ import annotations

import math
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from e2eprof.analysis.verdict import MIN_SAMPLES
from e2eprof.errors import UsageError
from e2eprof.render.diff_changes import environment_changes, identity_differences, run_flags
from e2eprof.render.diff_records import (BELOW_MARGIN, FASTER, METRICS, NO_SIGNIFICANT_DIFFERENCE, ONLY_IN_A, ONLY_IN_B,
                                         OUT_OF_MEMORY_IN_A, OUT_OF_MEMORY_IN_B, REGRESSIONS, SLOWER, SPEEDUP_DROPPED,
                                         SPEEDUP_GREW, TOO_FEW_SAMPLES, DiffConfig, RunRecord, _key, is_sweep, load_run)
from e2eprof.render.diff_rows import arm_rows, speedup_rows
from e2eprof.tables import reports

# The public names of `diff`: those defined here and those its parts define (cli and tests import them from here).
__all__ = [
    "BELOW_MARGIN", "FASTER", "METRICS", "NO_SIGNIFICANT_DIFFERENCE", "ONLY_IN_A", "ONLY_IN_B", "OUT_OF_MEMORY_IN_A",
    "OUT_OF_MEMORY_IN_B", "REGRESSIONS", "SLOWER", "SPEEDUP_DROPPED", "SPEEDUP_GREW", "TOO_FEW_SAMPLES", "DiffConfig",
    "RunRecord", "load_run", "RunDiff", "diff_runs", "write_diff", "outcome", "to_markdown", "print_diff",
]


@dataclass
class RunDiff:
    """What `diff_runs` returns: both runs, what changed between them, flags, the rows, where they were written."""

    config: DiffConfig
    run_a: RunRecord
    run_b: RunRecord
    changes: list[str]
    flags: list[str]
    rows: pd.DataFrame
    out_dir: Path | None = None
    different_comparison: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> pd.DataFrame:
        return self.rows[self.rows.status.isin(REGRESSIONS)]

    @property
    def exit_code(self) -> int:
        return 1 if len(self.regressions) else 0

    @property
    def sweep(self) -> bool:
        return is_sweep(self.run_a, self.run_b)


def diff_runs(config: DiffConfig, write: bool = True) -> RunDiff:
    """Compare RUN_B against RUN_A (see module docstring) and write diff.parquet and diff.md unless write=False."""
    a, b = load_run(config.run_a, "A"), load_run(config.run_b, "B")
    different = identity_differences(a, b)
    if not is_sweep(a, b):
        # One point each: row against row, as before sweeps (under --allow-different the two points may differ).
        label = a.points[0] if a.points == b.points else f"{a.points[0]} | {b.points[0]}"
        a, b = a.relabelled(label), b.relabelled(label)
    if different and not config.allow_different:
        raise UsageError(f"RUN_A and RUN_B are not the same comparison ({'; '.join(different)}); "
                         "use --allow-different to diff them anyway")
    if config.metric == "device" and not (a.warm.device_ms.notna().any() and b.warm.device_ms.notna().any()):
        raise UsageError("--metric device: a run has no device times (CPU runs record none); use --metric wall")
    flags = [f"DIFFERENT_COMPARISON: {d}" for d in different] + run_flags(a, b, config.metric)
    arms = arm_rows(a, b, config)
    sweep = is_sweep(a, b)
    few = [_key(sweep, r["point"], r["workload"], r["arm"]) for r in arms if 0 < min(r["n_a"], r["n_b"]) < MIN_SAMPLES]
    if few:  # same threshold as compare's TOO_FEW_SAMPLES: intervals from so few medians are lumpy
        flags.append(f"FEW_SAMPLES: under {MIN_SAMPLES} timed steps in a run for {', '.join(few)}; intervals are rough")
    rows = pd.DataFrame(arms + speedup_rows(a, b, config))
    result = RunDiff(config, a, b, environment_changes(a, b), flags, rows, different_comparison=different)
    if write:
        write_diff(result)
    return result


def write_diff(result: RunDiff) -> Path:
    """diff.parquet (one row per workload/arm, then speedup rows; run-level facts as constant columns) and diff.md."""
    out = result.config.out_dir
    c = result.config
    frame = result.rows.assign(
        run_a=str(result.run_a.path), run_b=str(result.run_b.path), run_a_id=result.run_a.run.get("run_id"),
        run_b_id=result.run_b.run.get("run_id"), metric=c.metric, min_change=c.min_change, confidence=c.confidence,
        changes_json=reports.to_json(result.changes), flags_json=reports.to_json(result.flags))
    reports.write_table(out, "diff", frame)
    _write_text_atomic(out / "diff.md", to_markdown(result))
    result.out_dir = out
    return out


def _write_text_atomic(path: Path, text: str) -> None:
    """Same pattern as reports.write_table: a temporary name in the same folder, then a rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _num(value, spec: str = ".2f") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def _interval(value, low, high, spec: str = ".3f", suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:{spec}}{suffix} [{low:{spec}}, {high:{spec}}]"


def _cells(result: RunDiff) -> tuple[list[str], list[list[str]], list[str], list[list[str]]]:
    """Header and cells of the two tables, shared by the terminal and the markdown file (a point column in a sweep)."""
    sweep = result.sweep
    lead = ["point"] if sweep else []
    arm_header = [*lead, "workload", "arm", "n A/B", "median A ms", "median B ms", "B/A [CI]", "p (Holm)", "status"]
    arm_cells = [[*([r.point] if sweep else []), r.workload, r.arm, f"{r.n_a:.0f}/{r.n_b:.0f}", _num(r.median_a_ms),
                  _num(r.median_b_ms), _interval(r.ratio, r.ci_low, r.ci_high), _num(r.p_adjusted, ".3g"), r.status]
                 for r in result.rows[result.rows.kind == "arm"].itertuples()]
    speed_header = [*lead, "workload", "speedup A [CI]", "speedup B [CI]", "B - A [CI]", "p (Holm)", "status"]
    speed_cells = [[*([r.point] if sweep else []), r.workload,
                    _interval(r.speedup_a, r.speedup_a_low, r.speedup_a_high, suffix="x"),
                    _interval(r.speedup_b, r.speedup_b_low, r.speedup_b_high, suffix="x"),
                    _interval(r.diff, r.diff_low, r.diff_high, spec="+.3f"), _num(r.p_adjusted, ".3g"), r.status]
                   for r in result.rows[result.rows.kind == "speedup"].itertuples()]
    return arm_header, arm_cells, speed_header, speed_cells


def outcome(result: RunDiff) -> str:
    """One line: what got worse (exit 1) or that nothing did (exit 0)."""
    worse = [f"{_key(result.sweep, r.point, r.workload, r.arm)} {r.status}" for r in result.regressions.itertuples()]
    if worse:
        return f"REGRESSION: {', '.join(worse)} (beyond --min-change {result.config.min_change:g}; exit 1)"
    return f"no significant regression beyond --min-change {result.config.min_change:g} (exit 0)"


def _method_line(result: RunDiff) -> str:
    c = result.config
    n_tests = int(result.rows.p_adjusted.notna().sum()) if len(result.rows) else 0
    noise = ", ".join(dict.fromkeys(f"{run.process_noise:.2%}" for run in (result.run_a, result.run_b)))
    return (f"metric: {METRICS[c.metric]} (ms). B/A above 1: B slower. {c.confidence:.0%} bootstrap intervals, the two "
            f"runs resampled independently and widened by their process noise ({noise} for one process against "
            f"one: A and B ran in other processes); Mann-Whitney (arms) and bootstrap (speedups) p-values "
            f"Holm-adjusted per table ({n_tests} tests); speedup = baseline / patched median, the interval within a "
            f"run as `compare` computes it.")


def to_markdown(result: RunDiff) -> str:
    """diff.md: the same content as the terminal output, for a pull request or a CI artifact."""
    a, b = result.run_a, result.run_b
    arm_header, arm_cells, speed_header, speed_cells = _cells(result)

    def table(header, cells):
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return lines + ["| " + " | ".join(map(str, row)) + " |" for row in cells]

    lines = [f"# e2eprof diff: {b.path.name} (B) vs {a.path.name} (A)", "",
             f"- A: `{a.path}` (run {a.run.get('run_id')})", f"- B: `{b.path}` (run {b.run.get('run_id')})", "",
             _method_line(result), "", "## What changed", ""]
    lines += [f"- {c}" for c in result.changes] or ["- nothing recorded differs"]
    lines += ["", "## Flags", ""] + ([f"- {f}" for f in result.flags] or ["- none"])
    lines += ["", "## Per point, workload and arm" if result.sweep else "## Per workload and arm", ""]
    lines += table(arm_header, arm_cells)
    lines += ["", "## Kernel speedup (patched vs baseline)", ""]
    lines += table(speed_header, speed_cells) if speed_cells else ["no workload with both arms in both runs"]
    lines += ["", f"**{outcome(result)}**", ""]
    return "\n".join(lines)


def print_diff(console: Console, result: RunDiff) -> None:
    """The terminal view: changes, flags, the two tables, the outcome line and where the files are."""
    arm_header, arm_cells, speed_header, speed_cells = _cells(result)
    console.print(f"e2eprof diff: B = {result.run_b.path} vs A = {result.run_a.path}")
    console.print("what changed:" + ("" if result.changes else " nothing recorded differs"))
    for change in result.changes:
        console.print(f"  - {change}", markup=False, highlight=False)
    for flag in result.flags:
        console.print(f"  [yellow]flag[/yellow] {escape(flag)}")
    style = {SLOWER: "bold red", SPEEDUP_DROPPED: "bold red", OUT_OF_MEMORY_IN_B: "bold red", FASTER: "green",
             SPEEDUP_GREW: "green"}
    arm_title = "per point, workload and arm" if result.sweep else "per workload and arm"
    for title, header, cells in ((arm_title, arm_header, arm_cells),
                                 ("kernel speedup (patched vs baseline)", speed_header, speed_cells)):
        if not cells:
            continue
        table = Table(title=title, title_justify="left")
        for column in header:
            table.add_column(column, justify="left" if column in ("point", "workload", "arm", "status") else "right")
        for row in cells:
            table.add_row(*row[:-1], f"[{style[row[-1]]}]{row[-1]}[/]" if row[-1] in style else row[-1])
        console.print(table)
    console.print(_method_line(result), style="dim")
    console.print(outcome(result), style="bold red" if result.exit_code else "bold green")
    if result.out_dir is not None:
        console.print(f"diff: {result.out_dir}")
