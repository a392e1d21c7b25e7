"""Shape and dtype sweeps: the grid of (batch, seq, precision) points one report covers, and out-of-memory outcomes.

A kernel that wins at one tensor size may lose at another, so a sweep keeps every point apart: each row of every
table carries the point's identity columns (batch, seq, precision and a `point` id such as "b8-s1024-bf16"), and the
summary has one verdict per (point, workload). Nothing here imports the runner or the config: both import this.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where a table is built: a worker imports this module (via the config) but never pandas
    import pandas as pd

POINT_COLUMNS = ("point", "batch", "seq", "precision")
OOM_METRIC = "oom"  # correctness.parquet metric of an out-of-memory row
OUT_OF_MEMORY = "OUT_OF_MEMORY"  # summary reason of a (point, workload) that did not fit
# The exception names a worker reports when memory ran out: CUDA's allocator error and Python's (host) one.
OOM_TYPES = ("OutOfMemoryError", "MemoryError")


@dataclass(frozen=True)
class SweepPoint:
    """One shape and dtype of a run: every arm and workload is measured at it."""

    batch: int
    seq: int
    precision: str

    @property
    def id(self) -> str:
        """Short, sortable-by-eye name used in tables and the console: b8-s1024-bf16."""
        return f"b{self.batch}-s{self.seq}-{self.precision}"

    def columns(self) -> dict:
        """The identity columns every row measured at this point carries."""
        return {"point": self.id, "batch": self.batch, "seq": self.seq, "precision": self.precision}


def grid(batches: Iterable[int], seqs: Iterable[int], precisions: Iterable[str]) -> tuple[SweepPoint, ...]:
    """Every combination, precision outermost then seq then batch, so neighbouring points share a dtype and length."""
    return tuple(SweepPoint(b, s, p) for p, s, b in itertools.product(precisions, seqs, batches))


def as_tuple(value) -> tuple:
    """A single option value or a list of them as a tuple (a string is one value, not its characters)."""
    if isinstance(value, (str, int)) or not isinstance(value, Iterable):
        return (value,)
    return tuple(value)


def is_oom(failure) -> bool:
    """Whether an arm failure (ArmFailed) was memory running out rather than a bug or a crash."""
    return getattr(failure, "kind", None) == "error" and str(getattr(failure, "message", "")).startswith(OOM_TYPES)


def oom_row(workload: str, arm: str, phase: str, message: str) -> dict:
    """The correctness.parquet row that records an out-of-memory arm at the current point."""
    return {"workload": workload, "arm": arm, "tensor": "-", "metric": OOM_METRIC, "value": float("nan"),
            "tolerance": float("nan"), "passed": False, "detail": f"out of memory during {phase}: {message}"}


def stamp(rows: list[dict], point: SweepPoint, start: int) -> int:
    """Give rows[start:] the point's identity columns (rows that already carry a point keep it); returns len(rows)."""
    columns = point.columns()
    for row in rows[start:]:
        if "point" not in row:
            row.update(columns)
    return len(rows)


def by_point(frame: pd.DataFrame, fn: Callable[[pd.DataFrame], pd.DataFrame | list[dict]]) -> pd.DataFrame:
    """Apply a per-workload table function to each point's rows separately and put the identity columns back.

    Functions such as the op diff or the telemetry balance group by workload and arm only; fed a whole sweep they
    would pool different shapes into one number.
    """
    import pandas as pd

    if not len(frame) or "point" not in frame:
        return pd.DataFrame(fn(frame))
    parts = []
    for _, rows in frame.groupby("point", sort=False):
        identity = {c: rows[c].iloc[0] for c in POINT_COLUMNS}
        part = pd.DataFrame(fn(rows.drop(columns=list(POINT_COLUMNS))))
        if len(part):
            parts.append(part.assign(**identity))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def search_max_batch(fits: Callable[[int], bool], cap: int, start: int = 1) -> tuple[int, list[tuple[int, bool]]]:
    """Largest batch in [start, cap] for which `fits(batch)` holds, assuming it fits below any batch that fits.

    Doubling from `start` until a batch does not fit (or the cap is reached), then a binary search between the last
    batch that fit and the first that did not. Returns (largest fitting batch or 0 when even `start` fails, the
    probes made in order as (batch, fitted)).
    """
    probes: list[tuple[int, bool]] = []

    def probe(batch: int) -> bool:
        ok = fits(batch)
        probes.append((batch, ok))
        return ok

    if not probe(start):
        return 0, probes
    good, bad = start, None
    while bad is None and good < cap:
        candidate = min(2 * good, cap)
        if probe(candidate):
            good = candidate
        else:
            bad = candidate
    while bad is not None and bad - good > 1:
        middle = (good + bad) // 2
        if probe(middle):
            good = middle
        else:
            bad = middle
    return good, probes
