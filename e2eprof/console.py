"""Terminal output: progress while running, then a table per workload. Printing only; no decisions here."""

from __future__ import annotations

import math

import pandas as pd
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from e2eprof.sweep import OUT_OF_MEMORY as OUT_OF_MEMORY_REASON

VERDICT_STYLE = {"PASS": "bold green", "FAIL": "bold red", "INCONCLUSIVE": "bold yellow"}


class ConsoleEvents:
    """Receives runner events and shows them: phase lines on stderr, a progress bar for timed blocks."""

    def __init__(self, console: Console):
        self.console = console
        self.progress: Progress | None = None
        self.task = None

    def __call__(self, kind: str, **info) -> None:
        if kind == "start":
            c = info["config"]
            self.console.print(f"e2eprof compare: model={c.model} patch={c.patch} device={c.device} batch={_listed(c.batch)} "
                               f"seq={_listed(c.seq)} dtype={_listed(c.precision)} steps={c.steps} -> {info['run_dir']}",
                               highlight=False)
        elif kind == "point":
            self._stop_bar()
            self.console.print(f"[bold]point {info['index'] + 1}/{info['total']}: {info['point'].id}[/bold]")
        elif kind == "phase":
            self._stop_bar()
            detail = f" ({info['detail']})" if info.get("detail") else ""
            self.console.print(f"[dim]·[/dim] {info['name']}{detail}")
        elif kind == "built":
            for arm, build in info["builds"].items():
                sites = sum(s["count"] for s in build["sites"])
                extra = f", patch replaced {sites} site(s)" if build["sites"] else ""
                self.console.print(f"  [dim]{arm}: model built in {build['build_s']:.1f} s{extra}"
                                   f"{_start_up(build)}[/dim]")
        elif kind == "timing":
            self._stop_bar()
            # Only on a terminal: elsewhere (CI logs, files) a transient bar leaves nothing but empty lines.
            self.progress = Progress(TextColumn("  {task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), console=self.console, transient=True,
                                     disable=not self.console.is_terminal)
            self.progress.start()
            self.task = self.progress.add_task(f"{info['workload']}: timed blocks", total=info["total"])
        elif kind == "advance" and self.progress is not None:
            self.progress.advance(self.task)
        elif kind == "timing_extend" and self.progress is not None:
            # Adaptive length: the interval is not tight enough yet, so another round of blocks runs.
            self.progress.update(self.task, total=info["total"])

    def _stop_bar(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def close(self) -> None:
        self._stop_bar()


def _listed(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _fmt(value, spec: str = ".2f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def _interval(ratio, low, high) -> str:
    if ratio is None or (isinstance(ratio, float) and math.isnan(ratio)):
        return "-"
    return f"{ratio:.3f}x [{low:.3f}, {high:.3f}]"


def _print_top_changes(console: Console, run_dir, workload: str, top: int = 5) -> None:
    from e2eprof.tables.rundir import RunDir

    diff = RunDir(run_dir).read_if_present("opdiff")
    if diff is None:
        return
    diff = diff[diff.workload == workload]
    several = "candidate" in diff and diff["candidate"].notna().any()
    for candidate, rows in (diff.groupby("candidate", sort=False) if several else [("patched", diff)]):
        if not len(rows):
            continue
        console.print(f"  where the time went ({candidate} - baseline, per step):")
        for r in rows.head(top).itertuples():
            console.print(f"    {r.delta_us / 1e3:+8.3f} ms  {r.op} [{r.direction}] in {r.module} ({r.status})")


def _reference_arms(rows: pd.DataFrame) -> list[str]:
    """Stock arms the candidate was compared with: every speedup_vs_<arm> column with a value."""
    return [c.removeprefix("speedup_vs_") for c in rows.columns
            if c.startswith("speedup_vs_") and c != "speedup_vs_baseline" and rows[c].notna().any()]


def _beats_line(candidate: pd.Series, references: list[str]) -> str | None:
    """Plain words on whether the candidate beats each stock path (the interval decides, not the point estimate)."""
    parts = []
    for ref in references:
        ratio, low, high = candidate.get(f"speedup_vs_{ref}"), candidate.get(f"{ref}_ci_low"), candidate.get(f"{ref}_ci_high")
        if ratio is None or pd.isna(ratio):
            continue
        answer = "yes" if low > 1 else ("no, it is slower" if high < 1 else "not resolved")
        parts.append(f"beats {ref}? {answer} ({_interval(ratio, low, high)})")
    return "; ".join(parts) or None


def print_summary(console: Console, summary: pd.DataFrame, verdicts: dict, run_dir,
                  ranking: dict | None = None) -> None:
    """One table per workload (a grid of points x workloads for a sweep), then the verdicts and where the report lives.

    ranking: several candidates' ranking as just judged (`e2eprof gate`); None reads the one run.parquet recorded."""
    if "point" in summary and summary["point"].nunique() > 1:
        print_sweep(console, summary, verdicts, run_dir, ranking)
        return
    # What changed a workload's measurement without failing a check (render.tables.measurement_notes), said under its
    # table: a reader of the console alone once took a run with two replicas dropped and the reference on the host
    # for one with every process and the reference on the GPU. Read once for every workload.
    from e2eprof.render.tables import measurement_notes
    from e2eprof.tables.rundir import RunDir

    checks = RunDir(run_dir).read_if_present("correctness")
    for workload, rows in summary.groupby("workload", sort=False):
        references = _reference_arms(rows)
        candidate_rows = rows[rows.verdict.notna()] if "verdict" in rows else rows.iloc[0:0]
        candidate = candidate_rows.iloc[0] if len(candidate_rows) else None
        # Several candidates: each candidate's row holds its own figure against the reference.
        name = "candidate" if len(candidate_rows) > 1 else candidate["arm"] if candidate is not None else "patched"
        table = Table(title=f"{workload}", title_justify="left", show_lines=False)
        columns = ["arm", "median ms", "p10/p90 ms", "cold ms", "vs baseline [CI]",
                   *[f"{name} vs {ref} [CI]" for ref in references], "correct"]
        for column in columns:
            table.add_column(column, justify="left" if column in ("arm", "correct") else "right")
        for _, row in rows.iterrows():
            table.add_row(
                str(row["arm"]), _fmt(row.get("median_ms")),
                f"{_fmt(row.get('p10_ms'))}/{_fmt(row.get('p90_ms'))}", _fmt(row.get("cold_ms"), ".1f"),
                _interval(row.get("speedup_vs_baseline"), row.get("ci_low"), row.get("ci_high")) if row["arm"] != "baseline" else "1",
                *[_interval(row.get(f"speedup_vs_{ref}"), row.get(f"{ref}_ci_low"), row.get(f"{ref}_ci_high")) for ref in references],
                "yes" if row.get("correct") else "NO",
            )
        console.print(table)
        if "compile" in set(rows.arm):
            console.print(f"  compile: first step {_fmt(rows[rows.arm == 'compile'].iloc[0].get('cold_ms') / 1e3, '.1f')} s "
                          "(includes compilation; not in the step times)")
        if workload in ("decode", "generate") and "ttft_median_ms" in rows:
            parts = [f"{r.arm}: TTFT {_fmt(r.ttft_median_ms)} ms, {_fmt(r.tpot_median_ms, '.3f')} ms/token" for r in rows.itertuples()]
            console.print("  " + "; ".join(parts))
        if candidate is not None and not pd.isna(candidate.get("ci_half_width", math.nan)):
            processes = candidate.get("processes", 1)
            processes = 1 if pd.isna(processes) else int(processes)
            console.print(f"  timing: {int(candidate.get('blocks', 0))} blocks per arm ({candidate.get('stop_reason', '-')})"
                          + (f" in each of {processes} processes" if processes > 1 else "")
                          + f"; smallest resolvable effect ~{candidate['mde'] * 100:.2f}%")
        for _, note in measurement_notes(checks, workload):
            console.print(f"  note: {note}")
        for _, each in candidate_rows.iterrows():  # every candidate answers for itself
            if line := _beats_line(each, references):
                console.print(f"  {each['arm']}: {line}")
        patched = rows[rows.arm == "patched"]
        if len(patched) and "predicted_speedup" in patched and not pd.isna(patched.iloc[0].get("predicted_speedup")):
            r = patched.iloc[0]
            console.print(f"  replaced op: {r.replaced_share * 100:.1f}% of the baseline step, {r.replaced_speedup:.2f}x faster in the "
                          f"profile -> predicted {r.predicted_speedup:.3f}x (bound {r.amdahl_bound:.3f}x), measured "
                          f"{r.speedup_vs_baseline:.3f}x: {r.cause}")
            idle = [f"{a.arm} {a.idle_share:.2f}" for a in rows.itertuples() if not pd.isna(getattr(a, "idle_share", math.nan))]
            if idle:  # a device's idle time between kernels; a CPU run has none to show
                console.print("  GPU idle share: " + ", ".join(idle))
        _print_memory(console, rows)
        _print_ranks(console, rows)
        _print_top_changes(console, run_dir, workload)
        # Several candidates: one verdict each, keyed "<candidate>/<workload>".
        mine = {"": verdicts[workload]} if workload in verdicts else {
            k.rsplit("/", 1)[0] + " ": v for k, v in verdicts.items() if k.endswith(f"/{workload}")}
        for who, verdict in mine.items():
            console.print(f"  verdict {who}: [{VERDICT_STYLE[verdict.verdict]}]{verdict.verdict}[/] ({', '.join(verdict.reasons)})".replace(" :", ":")
                          + (f" — {verdict.advice}" if verdict.advice else ""))
    _print_ranking(console, summary, run_dir, ranking)
    console.print(f"report: {run_dir}")


def _print_ranking(console: Console, summary: pd.DataFrame, run_dir, ranking: dict | None = None) -> None:
    """Several candidates: their ranking by speedup over the baseline, and the best one that passes."""
    if "candidate" not in summary or not summary["candidate"].notna().any():
        return
    if ranking is None:
        import json
        from e2eprof.tables import reports
        try:
            ranking = json.loads(reports.read_table(run_dir, "run").iloc[0]["candidates_json"])
        except Exception:  # an unreadable run row: the summary's columns still rank them
            return
    shown = [f"{i + 1}. {name} {ranking['gmean'][name]:.3f}x" for i, name in enumerate(ranking["ranking"])]
    console.print("candidates by speedup over the baseline (geometric mean over workloads): " + ("; ".join(shown) or "none passed its gate"))
    unranked = [name for name in ranking["gmean"] if name not in ranking["ranking"]]
    if unranked:
        console.print("  not ranked (a correctness, proof or arm failure): " + ", ".join(unranked))
    if ranking["best"]:
        console.print(f"best candidate: {ranking['best']} ({ranking['lead']})", highlight=False)
    else:
        console.print("best candidate: none passes", highlight=False)


# What a verdict measured on a CPU is worth, said once at the end of every CPU run.
CPU_CAVEAT = ("CPU run: these verdicts show the pipeline works, not what the kernel is worth on the device it will run "
              "on; a CPU shared with other work moves step times by tens of percent, so sign off on a GPU run")


def print_outcome(console: Console, overall: str, exit_code: int, device: str) -> None:
    """The last lines of a run: on a CPU what its verdicts are worth, then the overall verdict and the exit code."""
    if not str(device).startswith("cuda"):
        console.print(CPU_CAVEAT, style="dim", highlight=False, soft_wrap=True)
    style = VERDICT_STYLE.get(overall)
    shown = f"[{style}]{overall}[/]" if style else overall
    console.print(f"e2eprof: {shown} (exit code {exit_code})", highlight=False, soft_wrap=True)


def _print_ranks(console: Console, rows: pd.DataFrame) -> None:
    """Data-parallel runs: how far apart the ranks ran, and how much of the step was communication."""
    if "ranks" not in rows or not (rows["ranks"].fillna(0) > 1).any():
        return
    spread = ", ".join(f"{r.arm} {r.rank_spread:.2f}x" for r in rows.itertuples() if not pd.isna(r.rank_spread))
    console.print(f"  ranks: {int(rows['ranks'].max())} per arm, step time = slowest rank's; "
                  f"slowest/fastest rank median: {spread}")
    if "comm_share" in rows and rows["comm_share"].notna().any():
        console.print("  communication share of the step: " + ", ".join(
            f"{r.arm} {r.comm_share * 100:.1f}%" for r in rows.itertuples() if not pd.isna(r.comm_share)))


def _print_memory(console: Console, rows: pd.DataFrame) -> None:
    """Peak memory of the timed steps per arm: device allocated/reserved where there is a device, host RSS always."""
    if "host_peak_rss_mb" not in rows or not rows["host_peak_rss_mb"].notna().any():
        return
    parts = []
    for r in rows.itertuples():
        device = (f"{r.peak_alloc_mb:.0f}/{r.peak_reserved_mb:.0f} MB device (alloc/reserved), "
                  if not pd.isna(getattr(r, "peak_alloc_mb", math.nan)) else "")
        ratio = getattr(r, "peak_memory_vs_baseline", math.nan)
        versus = f" ({ratio:.2f}x baseline)" if r.arm != "baseline" and not pd.isna(ratio) else ""
        parts.append(f"{r.arm} {device}{_fmt(r.host_peak_rss_mb, '.0f')} MB host{versus}")
    console.print("  peak memory: " + "; ".join(parts))


def _cell(row: pd.Series | None) -> str:
    if row is None:
        return "-"
    verdict = row.get("verdict")
    style = VERDICT_STYLE.get(verdict, "")
    reasons = row.get("reasons") or ""
    shown = f"[{style}]{verdict}[/]" if style else str(verdict)
    if OUT_OF_MEMORY_REASON in str(reasons):
        return f"out of memory {shown}"
    return f"{_interval(row.get('speedup_vs_baseline'), row.get('ci_low'), row.get('ci_high'))} {shown}"


def print_sweep(console: Console, summary: pd.DataFrame, verdicts: dict, run_dir, ranking: dict | None = None) -> None:
    """A grid of point x workload -> speedup [CI] verdict, where the kernel wins and loses, memory, the overall verdict."""
    judged = summary[summary["verdict"].notna()]
    points = list(dict.fromkeys(summary["point"]))
    workloads = list(dict.fromkeys(summary["workload"]))
    name = judged["arm"].iloc[0] if len(judged) else "patched"
    # Several candidates: a column per (workload, candidate).
    columns = [(w, a) for w in workloads for a in dict.fromkeys(judged[judged["workload"] == w]["arm"])]
    several = len(columns) > len(workloads)
    table = Table(title=f"{'candidates' if several else name} vs baseline per point", title_justify="left")
    table.add_column("point", justify="left")
    for workload, arm in columns:
        table.add_column(f"{workload} {arm}" if several else workload, justify="right")
    for point in points:
        cells = []
        for workload, arm in columns:
            found = judged[(judged["point"] == point) & (judged["workload"] == workload) & (judged["arm"] == arm)]
            cells.append(_cell(found.iloc[0] if len(found) else None))
        table.add_row(point, *cells)
    console.print(table)
    for workload in workloads:
        mine = judged[(judged["workload"] == workload) & judged["ci_low"].notna()] if "ci_low" in judged else judged.iloc[0:0]
        faster = list(mine[mine["ci_low"] > 1]["point"])
        slower = list(mine[mine["ci_high"] < 1]["point"])
        if faster and slower:
            console.print(f"  {workload}: {name} WINS at {', '.join(faster)} but LOSES at {', '.join(slower)}: "
                          "the speedup depends on the shape; it is not one number")
    if "host_peak_rss_mb" in summary:
        console.print("peak memory during timing (MB; device alloc/reserved, host RSS):")
        for point in points:
            at = summary[(summary["point"] == point) & summary["host_peak_rss_mb"].notna()]
            per_arm = at.groupby("arm", sort=False)[["peak_alloc_mb", "peak_reserved_mb", "host_peak_rss_mb"]].max()
            parts = [f"{arm} {_fmt(r.peak_alloc_mb, '.0f')}/{_fmt(r.peak_reserved_mb, '.0f')}, host {_fmt(r.host_peak_rss_mb, '.0f')}"
                     for arm, r in per_arm.iterrows()]
            if parts:
                console.print(f"  {point}: " + "; ".join(parts))
    overall = [v.verdict for v in verdicts.values()]
    if overall and not several:  # several candidates: the ranking below and the last line say the run's verdict
        from e2eprof.analysis.verdict import worst

        verdict = worst(overall)
        counts = ", ".join(f"{overall.count(v)} {v}" for v in ("PASS", "INCONCLUSIVE", "FAIL") if overall.count(v))
        console.print(f"overall: [{VERDICT_STYLE[verdict]}]{verdict}[/] (worst of {len(overall)} point/workload verdicts: {counts})")
    _print_ranking(console, summary, run_dir, ranking)
    console.print(f"report: {run_dir}")


def _start_up(build: dict) -> str:
    """The worker's own start-up clock, where its platform has one: when its imports were done, it read its setup and
    its build began, in seconds since the process started. A process started early reads its setup once its imports
    are done: a later read means the parent's checks were still running."""
    ages = build.get("process_age_s") or {}
    if any(ages.get(k) is None for k in ("imported", "setup", "build")):
        return ""
    return (f" (process: imports done at {ages['imported']:.1f} s, setup read at {ages['setup']:.1f} s, "
            f"build began at {ages['build']:.1f} s)")
