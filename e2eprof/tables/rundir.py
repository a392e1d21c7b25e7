"""A run directory: its Parquet tables read back by name with their declared dtypes, and written through
reports.write_table. Resume, diff, render and the benchmarks read runs through this one class.

No torch import: reading a report must work where only pandas is installed.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from e2eprof.tables import reports
from e2eprof.tables import schema


class RunDir:
    """The report directory at `path` (one run's `<table>.parquet` files)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def file(self, name: str) -> Path:
        return self.path / f"{name}.parquet"

    def has(self, name: str) -> bool:
        return self.file(name).is_file()

    def tables(self) -> list[str]:
        """Names of the tables present, sorted (declared or not; temporary files of a write in progress are not)."""
        return sorted(p.stem for p in self.path.glob("*.parquet") if p.is_file() and not p.name.startswith("."))

    def read(self, name: str, columns: list[str] | None = None) -> pd.DataFrame:
        """Table `name` as written, an all-null column given its declared dtype (a file written before the schema
        holds nulls of no type there). FileNotFoundError when absent; columns absent from an older run stay absent."""
        return schema.typed(pd.read_parquet(self.file(name), columns=columns), name)

    def read_if_present(self, name: str) -> pd.DataFrame | None:
        """Table `name`, or None when this run did not write it."""
        return self.read(name) if self.has(name) else None

    def run_row(self) -> dict:
        """run.parquet's single row; ValueError when it has none."""
        run = self.read("run")
        if not len(run):
            raise ValueError(f"{self.file('run')} has no rows")
        return run.iloc[0].to_dict()

    def write(self, name: str, rows: list[dict] | pd.DataFrame) -> Path:
        """Write table `name` atomically, conformed to its schema (reports.write_table)."""
        return reports.write_table(self.path, name, rows)

