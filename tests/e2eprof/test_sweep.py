"""Shape/dtype sweeps: the grid, list options, the max-batch search, and one real 2x2 sweep with an out-of-memory point.

The end-to-end run is the real CLI on gpt2-tiny on CPU. Out of memory is provoked honestly through the worker's test
hook E2EPROF_TEST_MAX_TOKENS (see e2eprof/trackers/memory.py): the worker raises MemoryError where an allocation would fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from e2eprof.config import CompareConfig
from e2eprof.errors import UsageError
from e2eprof.sweep import POINT_COLUMNS, SweepPoint, by_point, grid, search_max_batch

TIMEOUT_S = 600


def e2eprof(args: list[str], cwd, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("E2EPROF_DEBUG", "E2EPROF_TEST_MAX_TOKENS")} | env
    return subprocess.run([sys.executable, "-m", "e2eprof", *args], cwd=cwd, env=environ, capture_output=True,
                          text=True, timeout=TIMEOUT_S)


# ---- pure parts --------------------------------------------------------------------------------------------------

def test_grid_covers_every_combination_with_readable_ids():
    points = grid((1, 8), (128, 512), ("bf16", "fp32"))
    assert len(points) == 8 and len(set(points)) == 8
    assert points[0].id == "b1-s128-bf16" and points[1].id == "b8-s128-bf16" and points[-1].id == "b8-s512-fp32"
    assert SweepPoint(8, 1024, "bf16").columns() == {"point": "b8-s1024-bf16", "batch": 8, "seq": 1024, "precision": "bf16"}


def test_config_takes_lists_and_gives_each_point_its_own_settings():
    config = CompareConfig(model="gpt2-tiny", patch="fastsoftmax", device="cpu", batch=(1, 2), seq=[16, 32],
                           precision="fp32")
    assert config.is_sweep and [p.id for p in config.points] == ["b1-s16-fp32", "b2-s16-fp32", "b1-s32-fp32", "b2-s32-fp32"]
    at = config.at(config.points[3])
    assert (at.batch, at.seq, at.precision, at.is_sweep) == (2, 32, "fp32", False)
    single = CompareConfig(model="gpt2-tiny", patch="fastsoftmax", device="cpu", batch=(4,))
    assert single.batch == 4 and not single.is_sweep


@pytest.mark.parametrize("bad, field", [
    ({"batch": (1, 1)}, "--batch"), ({"batch": (2, 0)}, "--batch"), ({"seq": (16, 1)}, "--seq"),
    ({"precision": ("fp32", "fp8")}, "--dtype"), ({"precision": ("fp32", "fp16")}, "--dtype"),  # fp16 needs CUDA
    ({"max_batch": 0}, "--max-batch"),
])
def test_bad_sweep_values_are_usage_errors_naming_the_option(bad, field):
    with pytest.raises(UsageError, match=field):
        CompareConfig(model="gpt2-tiny", patch="fastsoftmax", device="cpu", **bad)


@pytest.mark.parametrize("limit, cap", [(1, 1024), (5, 1024), (37, 1024), (64, 1024), (1024, 1024), (3000, 1024),
                                        (700, 700), (9, 10)])
def test_max_batch_search_finds_the_limit_or_the_cap(limit, cap):
    best, probes = search_max_batch(lambda batch: batch <= limit, cap)
    assert best == min(limit, cap)
    assert all(batch <= cap for batch, _ in probes)
    assert len(probes) <= 2 * cap.bit_length() + 1  # doubling then bisection, never a linear scan


def test_max_batch_search_reports_zero_when_nothing_fits():
    assert search_max_batch(lambda batch: False, 64) == (0, [(1, False)])


def test_by_point_keeps_points_apart():
    frame = pd.DataFrame({"point": ["a", "a", "b"], "batch": [1, 1, 2], "seq": [8, 8, 8], "precision": ["fp32"] * 3,
                          "x": [1.0, 2.0, 10.0]})
    out = by_point(frame, lambda rows: [{"total": rows.x.sum(), "columns": ",".join(rows.columns)}])
    assert dict(zip(out.point, out.total)) == {"a": 3.0, "b": 10.0}
    assert set(out["columns"]) == {"x"}  # the function sees one point's rows without the identity columns


# ---- the CLI -----------------------------------------------------------------------------------------------------

def bad_list_args(tmp_path, option: str, value: str) -> list[str]:
    return ["compare", "--model", "gpt2-tiny", "--patch", "fastsoftmax", "--device", "cpu", "--workload", "infer",
            "--steps", "2", "--block-steps", "1", option, value, "--out", str(tmp_path / "r")]


@pytest.mark.parametrize("option, value, says", [
    ("--batch", "1,x", "--batch"), ("--batch", "1,,2", "--batch"), ("--seq", "16,16", "--seq"),
    ("--dtype", "fp32,fp99", "--dtype"), ("--batch", "0,2", "--batch"),
])
def test_cli_rejects_bad_lists_in_one_line(tmp_path, capsys, option, value, says):
    from e2eprof.cli import main  # the console script's function, in-process: parsing needs no worker

    assert main(bad_list_args(tmp_path, option, value)) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and says in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_cli_bad_list_through_the_real_entry_point(tmp_path):
    result = e2eprof(bad_list_args(tmp_path, "--batch", "8,x"), tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == "e2eprof: error: --batch: '8,x' is not a comma-separated list of integers"


# ---- a real 2x2 sweep with one point out of memory ---------------------------------------------------------------

@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    out = root / "report"
    # 40 tokens: b1-s16 (16), b2-s16 (32) and b1-s32 (32) fit; b2-s32 (64) runs out of memory in every arm.
    result = e2eprof(["compare", "--model", "gpt2-tiny", "--patch", "fastsoftmax", "--device", "cpu",
                      "--workload", "infer", "--batch", "1,2", "--seq", "16,32", "--steps", "2", "--block-steps", "1",
                      "--reference", "none", "--out", str(out)], root, E2EPROF_TEST_MAX_TOKENS="40")
    return result, out


ALL_POINTS = {"b1-s16-fp32", "b2-s16-fp32", "b1-s32-fp32", "b2-s32-fp32"}
FITTING = ALL_POINTS - {"b2-s32-fp32"}


def test_sweep_run_completes_and_prints_a_grid(sweep_run):
    result, out = sweep_run
    assert result.returncode == 3, result.stderr  # INCONCLUSIVE: too few steps to settle anything, and one OOM point
    assert "Traceback" not in result.stderr
    for point in ALL_POINTS:
        assert point in result.stdout
    assert "out of memory" in result.stdout
    assert "overall: INCONCLUSIVE" in result.stdout
    assert pd.read_parquet(out / "run.parquet").iloc[0].status == "complete"


def test_every_table_carries_the_point_identity(sweep_run):
    _, out = sweep_run
    tables = {path.stem: pd.read_parquet(path) for path in out.glob("*.parquet") if path.stem != "run"}
    assert {"steps", "correctness", "summary", "phases", "memory", "ops", "opdiff", "explain"} <= set(tables)
    for name, frame in tables.items():
        if not len(frame):
            continue
        assert set(POINT_COLUMNS) <= set(frame.columns), name
        assert frame.point.notna().all(), name
        # The id agrees with the columns it names.
        ids = frame.apply(lambda r: f"b{r.batch}-s{r.seq}-{r.precision}", axis=1)
        assert (ids == frame.point).all(), name
    steps = tables["steps"]
    assert set(steps.point) == FITTING  # the out-of-memory point ran no step
    warm = steps[steps.phase == "warm"]
    assert (warm.groupby(["point", "workload", "arm"]).size() == 2).all()
    run = pd.read_parquet(out / "run.parquet").iloc[0]
    assert {p["point"] for p in json.loads(run.points_json)} == ALL_POINTS


def test_one_verdict_per_point_and_workload_and_the_oom_point_is_recorded(sweep_run):
    _, out = sweep_run
    summary = pd.read_parquet(out / "summary.parquet")
    judged = summary[summary.verdict.notna()]
    assert sorted(judged.point) == sorted(ALL_POINTS) and set(judged.workload) == {"infer"}
    oom = judged[judged.point == "b2-s32-fp32"]
    assert (oom.verdict == "INCONCLUSIVE").all() and (oom.reasons == "OUT_OF_MEMORY").all()
    assert not judged[judged.point != "b2-s32-fp32"].reasons.str.contains("OUT_OF_MEMORY").any()
    # The adjustment spans every (point, workload) test of the run: one family, one correction.
    assert set(judged.correction.dropna()) == {"holm"}
    checks = pd.read_parquet(out / "correctness.parquet")
    rows = checks[checks.metric == "oom"]
    assert set(rows.point) == {"b2-s32-fp32"}
    assert set(zip(rows.arm, rows.workload)) == {("baseline", "infer"), ("patched", "infer")}
    assert rows.detail.str.contains("E2EPROF_TEST_MAX_TOKENS").all()
    assert not (checks.metric == "arm_failed").any()  # out of memory is not an arm failure
    assert pd.read_parquet(out / "run.parquet").iloc[0].verdict == "INCONCLUSIVE"
