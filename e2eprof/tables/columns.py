"""The vocabulary of the table schemas: Column, Table, the dtypes a column may declare, and whether a pandas column
holds what its dtype says.

Dtypes name what pandas holds after reading the file back:
  str      text (object column of str; JSON documents are str too)
  int64    integer; a column with missing values reads back as float64 holding whole numbers
  float64  real number, NaN when not measured
  bool     True/False; object when some rows have none
  Int64    nullable integer (pd.NA when not read)
  boolean  nullable boolean (pd.NA when unknown)
  string   pandas' string dtype
  list     a list of float64 per row

No torch import: readers (diff, render, benchmarks) use this on machines without it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

DTYPES = ("str", "int64", "float64", "bool", "Int64", "boolean", "string", "list")


class SchemaError(ValueError):
    """A table does not match its declared schema (raised in strict mode, and by `check`'s callers in tests)."""


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str
    meaning: str
    required: bool = True

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"column {self.name}: dtype {self.dtype!r} is not one of {DTYPES}")


@dataclass(frozen=True)
class Table:
    name: str
    meaning: str
    columns: tuple[Column, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.required)

    def column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)


def _values(series: pd.Series) -> pd.Series:
    return series[series.notna()] if series.dtype != object else series[[not _isnull(v) for v in series]]


def _isnull(value) -> bool:
    if isinstance(value, (list, tuple, np.ndarray)):
        return False
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def matches(series: pd.Series, dtype: str) -> bool:
    """Whether a column holds what `dtype` declares (an all-null column matches any dtype)."""
    values = _values(series)
    if len(values) == 0:
        return True
    kind = series.dtype
    if dtype in ("str", "string"):
        return (kind == object or isinstance(kind, pd.StringDtype)) and all(isinstance(v, str) for v in values)
    if dtype in ("int64", "Int64"):
        if pd.api.types.is_integer_dtype(kind):
            return True
        # pandas turns an integer column with missing rows into float64: whole numbers are fine.
        return pd.api.types.is_float_dtype(kind) and bool((values == np.floor(values)).all())
    if dtype == "float64":
        return pd.api.types.is_float_dtype(kind) or pd.api.types.is_integer_dtype(kind)
    if dtype in ("bool", "boolean"):
        return pd.api.types.is_bool_dtype(kind) or (kind == object and all(isinstance(v, (bool, np.bool_)) for v in values))
    if dtype == "list":
        return kind == object and all(isinstance(v, (list, tuple, np.ndarray)) for v in values)
    raise ValueError(f"unknown dtype {dtype!r}")


def null_series(dtype: str, index) -> pd.Series:
    """A column of nulls for `dtype`, as pandas holds a column of that dtype with every value missing: NaN for
    numbers (int64 too: pandas' own float64 for integers with missing values), None for text, bools and lists."""
    if dtype in ("float64", "int64"):
        return pd.Series(np.nan, index=index, dtype="float64")
    if dtype in ("Int64", "boolean", "string"):
        return pd.Series(pd.NA, index=index, dtype=dtype)
    return pd.Series(None, index=index, dtype=object)
