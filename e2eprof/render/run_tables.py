"""A report directory read for rendering: run.parquet's row and every optional table (RunTables), the run's
workloads, arms and sweep points, the Table of formatted cells, and the number formats every renderer shares.

Only pandas is needed: rendering a report must not import torch or re-run anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from e2eprof.errors import UsageError
from e2eprof.tables.rundir import RunDir


# Tables a report can use besides run.parquet; any of them may be missing (an early failure, a CPU run, --no-profile).
OPTIONAL_TABLES = ("summary", "steps", "correctness", "telemetry", "explain", "opdiff", "balance", "memory", "maxbatch",
                   "pairwise")
NOT_RECORDED = "not recorded in this run"


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


def missing(value) -> bool:
    return value is None or (not isinstance(value, str) and bool(pd.isna(value)))


def candidate_label(row) -> str:
    """An op diff row's workload, with its candidate where a run had several."""
    candidate = row.get("candidate")
    return str(row["workload"]) if missing(candidate) else f"{row['workload']} ({candidate})"


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
