"""Memory in a report: peaks of the timed steps per (point, workload, arm), arms that ran out of memory, what the
numbers mean on this machine, and --find-max-batch's largest batch per arm.
"""

from __future__ import annotations

import pandas as pd

from e2eprof.render.run_tables import NOT_RECORDED, RunTables, Table, fmt_num, is_sweep, missing
from e2eprof.sweep import OOM_METRIC


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
