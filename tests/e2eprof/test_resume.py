"""compare --resume: an interrupted sweep continues in its directory; finished units are kept byte for byte, the
half-measured one is rerun whole; other options are refused; a complete run has nothing to do.

Real compares of gpt2-tiny on CPU: a subprocess is sent SIGINT once the first (point, workload) unit is recorded
as finished and the second one's timed steps are on disk.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from e2eprof.cli import main

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# Two points (a sweep over --batch), one workload: units b1-s16-fp32/infer and b2-s16-fp32/infer. Enough steps
# that the second unit is still timing when the signal comes.
SWEEP = ["--model", "gpt2-tiny", "--patch", "fastsoftmax", "--workload", "infer", "--steps", "300", "--block-steps", "2",
         "--batch", "1,2", "--seq", "16", "--no-profile", "--reference", "none", "--device", "cpu"]
FIRST, SECOND = "b1-s16-fp32", "b2-s16-fp32"


def finished_units(out: Path) -> dict:
    raw = pd.read_parquet(out / "run.parquet").resume_json.iloc[0]
    return json.loads(raw) if isinstance(raw, str) else {}


def interrupted_sweep(out: Path) -> int:
    """Start the sweep, SIGINT it while the second unit is timing; returns the Unix ns the signal was sent at."""
    process = subprocess.Popen([sys.executable, "-m", "e2eprof", "compare", *SWEEP, "--out", str(out)], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        try:
            steps = pd.read_parquet(out / "steps.parquet")
            if f"{FIRST}/infer" in finished_units(out) and (steps.point == SECOND).any():
                break
        except (FileNotFoundError, OSError, ValueError, AttributeError, KeyError):
            pass
        time.sleep(0.05)
    assert process.poll() is None, "the run ended before it could be interrupted: " + process.stderr.read()
    sent = time.time_ns()
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    return sent


def unit_rows(frame: pd.DataFrame, point: str) -> pd.DataFrame:
    return frame[frame.point == point].reset_index(drop=True)


def test_an_interrupted_sweep_resumes_keeping_finished_units_and_rerunning_the_rest(tmp_path):
    out = tmp_path / "report"
    sent = interrupted_sweep(out)
    assert pd.read_parquet(out / "run.parquet").status.iloc[0] == "interrupted"
    before = {name: pd.read_parquet(out / f"{name}.parquet") for name in ("steps", "correctness", "memory")}
    assert (before["steps"].point == SECOND).any(), "the second unit was half measured when interrupted"
    assert set(finished_units(out)) == {f"{FIRST}/infer"}

    code = main(["compare", *SWEEP, "--out", str(out), "--resume"])

    run = pd.read_parquet(out / "run.parquet").iloc[0]
    assert run.status == "complete" and code in (0, 1, 3) and code == {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 3}[run.verdict]
    assert json.loads(run.resumes_json)[0]["from_status"] == "interrupted"
    assert set(finished_units(out)) == {f"{FIRST}/infer", f"{SECOND}/infer"}
    after = {name: pd.read_parquet(out / f"{name}.parquet") for name in before}
    # The finished unit's rows, exactly as the interrupted attempt wrote them.
    for name in before:
        pd.testing.assert_frame_equal(unit_rows(after[name], FIRST)[before[name].columns],
                                      unit_rows(before[name], FIRST), check_exact=True)
    # Every unit exactly once: one cold step and --steps warm steps per arm, no row of the interrupted attempt left.
    steps = after["steps"]
    for point in (FIRST, SECOND):
        mine = steps[steps.point == point]
        counts = mine.groupby(["arm", "phase"]).size().to_dict()
        assert counts[("baseline", "cold")] == counts[("patched", "cold")] == 1, counts
        assert counts[("baseline", "warm")] == counts[("patched", "warm")] == 300, counts
        assert not mine.duplicated(["arm", "phase", "step"]).any()
    assert (steps[steps.point == SECOND].start_unix_ns > sent).all(), "rows of the half-measured unit were pooled"
    checks = after["correctness"]
    assert not checks.duplicated(["point", "workload", "arm", "tensor", "metric"]).any()
    summary = pd.read_parquet(out / "summary.parquet")
    assert sorted(summary[summary.arm == "patched"].point) == [FIRST, SECOND]
    assert (summary[summary.arm == "patched"].n == 300).all()


@pytest.fixture(scope="module")
def complete_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("resume") / "report"
    args = ["compare", "--model", "gpt2-tiny", "--patch", "fastsoftmax", "--workload", "infer", "--steps", "6",
            "--block-steps", "2", "--batch", "1", "--seq", "16", "--no-profile", "--reference", "none",
            "--device", "cpu", "--out", str(out)]
    return args, main(args), out


def test_resume_of_a_complete_run_has_nothing_to_do(complete_run, capsys):
    args, code, out = complete_run
    before = {p.name: p.read_bytes() for p in out.glob("*.parquet")}
    capsys.readouterr()
    assert main([*args, "--resume"]) == code
    err = capsys.readouterr().err
    assert "already complete" in err and "nothing to resume" in err
    assert {p.name: p.read_bytes() for p in out.glob("*.parquet")} == before, "a complete run must stay untouched"


@pytest.mark.parametrize("change, option", [(["--steps", "8"], "--steps"), (["--seed", "1"], "--seed"),
                                            (["--batch", "2"], "--batch")])
def test_resume_with_other_options_is_refused(complete_run, change, option):
    args, _, _ = complete_run
    done = subprocess.run([sys.executable, "-m", "e2eprof", *args, *change, "--resume"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert f"started with {option}" in done.stderr and "--force" in done.stderr


def test_resume_needs_an_earlier_run(tmp_path):
    done = subprocess.run([sys.executable, "-m", "e2eprof", "compare", "--model", "gpt2-tiny", "--patch", "fastsoftmax",
                           "--device", "cpu", "--out", str(tmp_path / "none"), "--resume"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--resume needs --out" in done.stderr, done.stderr


def test_a_resume_reads_the_profiles_rows_back_from_their_tables(tmp_path):
    """resume_json holds a profile's totals only; its per-op rows come back from ops.parquet, so the explanation
    of a kept unit after a resume is the one the uninterrupted run wrote."""
    out = tmp_path / "report"
    args = ["compare", "--model", "gpt2-tiny", "--patch", "fastsoftmax", "--workload", "infer", "--steps", "4",
            "--block-steps", "2", "--batch", "1", "--seq", "16", "--reference", "none", "--device", "cpu",
            "--out", str(out)]
    assert main(args) in (0, 1, 3)
    explained = pd.read_parquet(out / "explain.parquet")
    summary = pd.read_parquet(out / "summary.parquet")
    assert len(explained) == 1 and summary.predicted_speedup.notna().any()
    # As if interrupted after its last unit was recorded: derived tables gone, status not complete.
    run = pd.read_parquet(out / "run.parquet")
    run.loc[0, "status"] = "interrupted"
    run.to_parquet(out / "run.parquet", index=False)
    for name in ("explain", "opdiff", "summary"):
        (out / f"{name}.parquet").unlink()

    assert main([*args, "--resume"]) in (0, 1, 3)

    pd.testing.assert_frame_equal(pd.read_parquet(out / "explain.parquet"), explained)
    again = pd.read_parquet(out / "summary.parquet")
    pd.testing.assert_series_equal(again.predicted_speedup, summary.predicted_speedup)
