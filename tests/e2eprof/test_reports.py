"""Parquet tables: atomic replacement, no temp files left behind, required columns always present."""

import os
import stat
from pathlib import PurePosixPath

import pandas as pd
import pyarrow
import pytest

from e2eprof.tables.reports import TABLE_COLUMNS, read_table, to_json, write_table

STEP = {"run_id": "r1", "workload": "train", "arm": "baseline", "block": 0, "step": 0, "phase": "timed",
        "wall_ns": 123_456, "device_ms": None, "start_unix_ns": 1, "end_unix_ns": 2, "ttft_ms": None, "tpot_ms": None}


def leftovers(directory):
    return sorted(p.name for p in directory.iterdir() if not p.name.endswith(".parquet"))


def test_roundtrip(tmp_path):
    rows = [STEP | {"step": i, "wall_ns": 1000 + i} for i in range(5)]
    path = write_table(tmp_path, "steps", rows)
    assert path == tmp_path / "steps.parquet"
    frame = read_table(tmp_path, "steps")
    assert list(frame.columns[: len(TABLE_COLUMNS["steps"])]) == list(TABLE_COLUMNS["steps"])
    assert frame["wall_ns"].tolist() == [1000, 1001, 1002, 1003, 1004]
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("name", sorted(TABLE_COLUMNS))
def test_required_columns_are_filled(tmp_path, name):
    write_table(tmp_path, name, [{"run_id": "r1", "extra_column": 7}])
    frame = read_table(tmp_path, name)
    required = list(TABLE_COLUMNS[name])
    assert list(frame.columns) == required + ["extra_column"]  # required first, in order; extras kept after
    assert frame.loc[0, "run_id"] == "r1" and frame.loc[0, "extra_column"] == 7
    assert frame.drop(columns=["run_id", "extra_column"]).isna().all().all()


def test_empty_rows_still_give_every_column(tmp_path):
    write_table(tmp_path, "correctness", [])
    frame = read_table(tmp_path, "correctness")
    assert len(frame) == 0 and list(frame.columns) == list(TABLE_COLUMNS["correctness"])


def test_callers_frame_is_not_changed(tmp_path):
    frame = pd.DataFrame([{"run_id": "r1", "workload": "train"}])
    write_table(tmp_path, "summary", frame)
    assert list(frame.columns) == ["run_id", "workload"]


def test_rewrite_replaces_whole_table(tmp_path):
    write_table(tmp_path, "steps", [STEP | {"step": i} for i in range(3)])
    write_table(tmp_path, "steps", [STEP | {"step": 9}])
    assert read_table(tmp_path, "steps")["step"].tolist() == [9]
    assert leftovers(tmp_path) == []


# Two ways a write fails: pyarrow cannot convert a bare object (fails before any file is opened), and Parquet
# cannot store a struct without fields (fails after the output file was opened and truncated: writing in place
# would destroy the previous table).
UNWRITABLE = {"object": object(), "empty_struct": {}}


@pytest.mark.parametrize("kind", sorted(UNWRITABLE))
def test_failed_write_keeps_previous_table(tmp_path, kind):
    write_table(tmp_path, "steps", [STEP])
    before = (tmp_path / "steps.parquet").read_bytes()
    bad = pd.DataFrame([STEP | {"payload": UNWRITABLE[kind]}])
    with pytest.raises(pyarrow.ArrowException):
        write_table(tmp_path, "steps", bad)
    assert (tmp_path / "steps.parquet").read_bytes() == before
    assert read_table(tmp_path, "steps")["wall_ns"].tolist() == [123_456]
    assert leftovers(tmp_path) == []  # the half-written temporary file is gone too


@pytest.mark.parametrize("kind", sorted(UNWRITABLE))
def test_failed_first_write_leaves_nothing(tmp_path, kind):
    with pytest.raises(pyarrow.ArrowException):
        write_table(tmp_path, "steps", pd.DataFrame([{"payload": UNWRITABLE[kind]}]))
    assert list(tmp_path.iterdir()) == []


def test_creates_missing_directory(tmp_path):
    write_table(tmp_path / "a" / "b", "run", [{"run_id": "r1"}])
    assert read_table(tmp_path / "a" / "b", "run")["run_id"].tolist() == ["r1"]


def test_file_mode_follows_umask(tmp_path):
    # Reports are shared: the table must be as readable as any file the user creates, not 0600.
    plain = tmp_path / "plain"
    plain.touch()
    path = write_table(tmp_path, "run", [{"run_id": "r1"}])
    assert stat.S_IMODE(os.stat(path).st_mode) == stat.S_IMODE(os.stat(plain).st_mode)


def test_to_json_is_stable():
    assert to_json({"b": 1, "a": {"z": 2, "y": 3}}) == '{"a": {"y": 3, "z": 2}, "b": 1}'
    assert to_json({"p": PurePosixPath("/x/y")}) == '{"p": "/x/y"}'  # non-JSON values as strings
