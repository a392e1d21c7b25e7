"""Declared table schemas (e2eprof.tables.schema): a real CPU compare run writes every table as declared, strict mode
rejects what is not declared, and RunDir reads the tables back with their declared dtypes."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from e2eprof.tables import reports
from e2eprof.tables import schema
from e2eprof.tables.rundir import RunDir

pytestmark = pytest.mark.slow

# What a profiled CPU compare writes (no telemetry, balance or blocks without a GPU; no microbench unless asked).
CPU_TABLES = {"run", "steps", "correctness", "phases", "memory", "jit", "ops", "kernels", "summary", "opdiff", "explain"}


@pytest.fixture(scope="module")
def strict_run(tmp_path_factory):
    """One small compare on CPU with strict tables: any write that breaks its schema fails the run."""
    out = tmp_path_factory.mktemp("schema") / "report"
    env = os.environ | {reports.STRICT_ENV: "1", "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-m", "e2eprof", "compare", "--model", "gpt2-tiny", "--patch",
                             "fastsoftmax", "--steps", "4", "--block-steps", "2", "--budget", "0", "--out", str(out)],
                            capture_output=True, text=True, timeout=600, env=env)
    return result, RunDir(out)


def test_the_strict_run_finishes_with_a_verdict(strict_run):
    result, _ = strict_run
    assert result.returncode in (0, 1, 3), result.stderr[-3000:]
    assert "SchemaError" not in result.stderr


def test_every_table_of_a_real_run_matches_its_schema(strict_run):
    _, run = strict_run
    assert set(run.tables()) == CPU_TABLES
    for name in run.tables():
        frame = pd.read_parquet(run.file(name))  # as on disk, not through RunDir's typing
        assert schema.problems(frame, name) == [], name
        declared = schema.table(name)
        assert set(declared.required) <= set(frame.columns), name
        # Declared order: the file's columns are the declared ones, in the schema's order.
        assert list(frame.columns) == [c for c in declared.names if c in frame.columns], name


def test_nulls_are_written_with_the_declared_dtype(strict_run):
    # A CPU run's kernels table has no rows: its columns were added by the writer, typed as declared.
    _, run = strict_run
    kernels = pd.read_parquet(run.file("kernels"))
    assert len(kernels) == 0
    assert kernels["calls"].dtype == np.float64 and kernels["total_us"].dtype == np.float64
    assert kernels["kernel"].dtype == object


def test_rundir_reads_tables_and_the_run_row(strict_run):
    _, run = strict_run
    row = run.run_row()
    assert row["schema_version"] == reports.SCHEMA_VERSION and row["status"] == "complete"
    for name in run.tables():
        assert len(run.read(name).columns) > 0 and run.has(name)
    assert run.read_if_present("telemetry") is None and not run.has("telemetry")
    summary = run.read("summary")
    assert {"train", "infer"} <= set(summary["workload"])


def test_every_declared_column_has_a_dtype_and_a_meaning():
    assert len(schema.TABLES) == 18  # pairwise.parquet: several candidates (e2eprof.candidates)
    for name, table in schema.TABLES.items():
        assert table.name == name and table.meaning
        assert len(set(table.names)) == len(table.names), name
        for column in table.columns:
            assert column.dtype in schema.DTYPES, (name, column.name)
            assert isinstance(column.meaning, str) and len(column.meaning) > 3, (name, column.name)


def test_table_columns_are_the_declared_required_columns():
    for name, columns in reports.TABLE_COLUMNS.items():
        assert columns == schema.table(name).required


STEP = {"run_id": "r", "workload": "train", "arm": "baseline", "block": 0, "step": 0, "rank": 0, "phase": "timing",
        "wall_ns": 1000, "device_ms": 1.0, "start_unix_ns": 1, "end_unix_ns": 2, "ttft_ms": np.nan, "tpot_ms": np.nan}


def test_strict_mode_rejects_an_undeclared_column(tmp_path, monkeypatch):
    monkeypatch.setenv(reports.STRICT_ENV, "1")
    with pytest.raises(schema.SchemaError, match="'surprise' is not declared"):
        reports.write_table(tmp_path, "steps", [STEP | {"surprise": 1.0}])
    assert not (tmp_path / "steps.parquet").exists()
    reports.write_table(tmp_path, "steps", [STEP])  # the declared columns alone pass
    assert (tmp_path / "steps.parquet").exists()


def test_strict_mode_rejects_an_undeclared_table_and_a_wrong_dtype(tmp_path, monkeypatch):
    monkeypatch.setenv(reports.STRICT_ENV, "1")
    with pytest.raises(schema.SchemaError, match="no declared schema"):
        reports.write_table(tmp_path, "surprises", [{"run_id": "r"}])
    with pytest.raises(schema.SchemaError, match="'wall_ns' does not hold int64"):
        reports.write_table(tmp_path, "steps", [STEP | {"wall_ns": "slow"}])
    with pytest.raises(schema.SchemaError, match="'step' does not hold int64"):
        reports.write_table(tmp_path, "steps", [STEP | {"step": 0.5}])


def test_a_run_keeps_an_undeclared_column(tmp_path, monkeypatch):
    # Outside tests a measured column is never dropped for want of a declaration: it is written after the others.
    monkeypatch.delenv(reports.STRICT_ENV, raising=False)
    reports.write_table(tmp_path, "steps", [STEP | {"surprise": 2.5}])
    frame = RunDir(tmp_path).read("steps")
    assert frame.columns[-1] == "surprise" and frame["surprise"].tolist() == [2.5]


def test_a_missing_required_column_is_added_as_nulls_of_its_dtype(tmp_path):
    reports.write_table(tmp_path, "steps", [{k: v for k, v in STEP.items() if k not in ("device_ms", "phase")}])
    frame = RunDir(tmp_path).read("steps")
    assert list(frame.columns) == list(schema.table("steps").required)
    assert frame["device_ms"].dtype == np.float64 and frame["device_ms"].isna().all()
    assert frame["phase"].dtype == object and frame["phase"].isna().all()


def test_rundir_types_untyped_nulls_of_an_older_file(tmp_path):
    # Files written before the schema hold an all-null column as Arrow's null type (object in pandas).
    pd.DataFrame({"run_id": ["r"], "speedup_vs_sdpa": [None]}).to_parquet(tmp_path / "summary.parquet")
    frame = RunDir(tmp_path).read("summary")
    assert frame["speedup_vs_sdpa"].dtype == np.float64
    assert RunDir(tmp_path).tables() == ["summary"]


@pytest.mark.parametrize("values, dtype, ok", [
    ([1, 2], "int64", True), ([1.0, np.nan], "int64", True), ([1.5], "int64", False),
    (["a", None], "str", True), ([1], "str", False), ([1, 2.5], "float64", True), (["1"], "float64", False),
    ([True, None], "bool", True), ([1], "bool", False), ([[1.0, 2.0], None], "list", True), ([None, None], "bool", True),
])
def test_matches(values, dtype, ok):
    assert schema.matches(pd.Series(values), dtype) is ok


def test_problems_names_a_missing_required_column():
    frame = pd.DataFrame([{k: v for k, v in STEP.items() if k != "wall_ns"}])
    assert schema.problems(frame, "steps") == ["steps: required column 'wall_ns' is missing"]
    assert schema.problems(frame, "steps", missing=False) == []
