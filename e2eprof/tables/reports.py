"""Parquet report tables: fixed names, declared schemas (e2eprof.tables.schema), a schema version, atomic writes.

Every table is written to a temporary name in the same directory and renamed into place, so a reader (or a
run killed mid-write) never sees a half-written Parquet file. Tables are rewritten whole as a run goes, which
keeps each file self-consistent at every moment.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pandas as pd

from e2eprof.tables import schema

SCHEMA_VERSION = 1

# Set to 1 to make write_table raise on a table that does not match its declared schema (tests/e2eprof/test_schema.py
# runs a real compare with it; test_compare_e2e can run under it too).
STRICT_ENV = "E2EPROF_STRICT_TABLES"

# Required columns of the tables every profiled compare run writes (tests read each of them from a CPU run);
# e2eprof.tables.schema.TABLES declares every table and column, these included.
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    name: schema.table(name).required for name in ("run", "steps", "correctness", "ops", "kernels", "jit", "summary")}


def conform(frame: pd.DataFrame, name: str, strict: bool | None = None) -> pd.DataFrame:
    """`frame` in table `name`'s declared layout: declared columns first in their order, a missing required column
    added as nulls of its dtype, an all-null column given its declared dtype; then any undeclared columns.

    strict (default: the E2EPROF_STRICT_TABLES environment variable) raises schema.SchemaError on an undeclared
    table or column or a value of the wrong kind. A run outside tests writes such a table anyway: what it measured
    is worth more than the layout, an hour of timing must not be lost to a column someone forgot to declare, and
    tests (strict) catch the omission before a release."""
    strict = os.environ.get(STRICT_ENV) == "1" if strict is None else strict
    declared = schema.TABLES.get(name)
    if declared is None:
        if strict:
            raise schema.SchemaError(f"table {name!r} has no declared schema in e2eprof.tables.schema")
        return frame
    if strict:
        found = schema.problems(frame, name, missing=False)  # missing required columns are added below
        if found:
            raise schema.SchemaError("; ".join(found))
    for column in declared.columns:
        if column.required and column.name not in frame.columns:
            frame[column.name] = schema.null_series(column.dtype, frame.index)
    frame = schema.typed(frame, name)
    names = set(declared.names)
    return frame[[c for c in declared.names if c in frame.columns] + [c for c in frame.columns if c not in names]]


def write_table(out_dir: Path, name: str, rows: list[dict] | pd.DataFrame) -> Path:
    """Write `<out_dir>/<name>.parquet` atomically, conformed to its declared schema (see conform)."""
    # A shallow copy: adding the missing required columns must not change the caller's frame.
    frame = rows.copy(deep=False) if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    frame = conform(frame, name)
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / f"{name}.parquet"
    # A unique name that pyarrow creates itself, so the file gets the usual umask mode (mkstemp's is 0600 and
    # would survive the rename, leaving reports unreadable to anyone else).
    tmp = out_dir / f".{name}.{os.getpid()}.{uuid.uuid4().hex}.parquet.tmp"
    try:
        frame.to_parquet(tmp, index=False)
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return final


def check_writable(folder: Path) -> None:
    """Raise OSError unless a file can be created in `folder`: permissions alone do not tell (root ignores them,
    read-only mounts and /proc refuse anyway), and finding out after an hour of measuring would lose it all."""
    probe = Path(folder) / f".e2eprof-write-check-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    probe.write_bytes(b"")
    probe.unlink()


def read_table(run_dir: Path, name: str) -> pd.DataFrame:
    """Read one table of a run directory (rundir.RunDir.read: with its declared dtypes)."""
    from e2eprof.tables.rundir import RunDir  # rundir writes through this module

    return RunDir(run_dir).read(name)


def to_json(value) -> str:
    """Stable JSON for nested config/environment columns (Parquet keeps them as strings)."""
    return json.dumps(value, sort_keys=True, default=str)
