"""Faults around a run: a patch that raises, returns the wrong shape or kills its worker; Ctrl-C and SIGTERM; reruns.

Every case is a real compare of gpt2-tiny on CPU (worker processes, report tables); the signal cases run the CLI
as a subprocess and signal it once it is, provably, inside its timing phase.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from e2eprof.cli import main

pytestmark = pytest.mark.slow

SMALL = ["--model", "gpt2-tiny", "--workload", "infer", "--steps", "6", "--block-steps", "2", "--batch", "1",
         "--seq", "16", "--no-profile", "--reference", "none", "--device", "cpu"]

FAULTY_BODIES = {
    "raises": 'raise RuntimeError("kernel launch failed")',
    "wrong_shape": "return F.softmax(input, dim=dim, dtype=dtype)[..., :-1]",
    "kills_worker": "os._exit(7)",  # a segfault or CUDA fault looks the same from the parent: the pipe closes
}


def faulty_patch(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"faulty_{kind}.py"
    path.write_text(textwrap.dedent(f"""
        import os
        import torch.nn.functional as F
        from e2eprof.kernels.fastsoftmax.patch import softmax_reference
        from e2eprof.patch import Patch

        def faulty_softmax(input, dim=None, _stacklevel=3, dtype=None):
            {FAULTY_BODIES[kind]}

        PATCH = Patch(name="faulty", targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
                      replacement=faulty_softmax, reference=softmax_reference, architectures=("gpt2",),
                      attn_implementation="eager")
    """))
    return path


@pytest.mark.parametrize("kind", list(FAULTY_BODIES))
def test_a_failing_patch_fails_the_run_and_keeps_the_baseline(tmp_path, kind):
    out = tmp_path / "report"
    assert main(["compare", *SMALL, "--patch", str(faulty_patch(tmp_path, kind)), "--out", str(out)]) == 1
    summary = pd.read_parquet(out / "summary.parquet")
    patched = summary[summary.arm == "patched"].iloc[0]
    assert patched.verdict == "FAIL" and "ARM_FAILED" in patched.reasons.split(","), patched.reasons
    checks = pd.read_parquet(out / "correctness.parquet")
    failure = checks[(checks.arm == "patched") & (checks.metric == "arm_failed")]
    assert len(failure) == 1
    if kind == "kills_worker":
        assert "exited with code 7" in failure.detail.iloc[0]
    if kind == "wrong_shape":  # the model raised in the cold step; a verified capture afterwards names the check
        shape = checks[(checks.arm == "patched") & (checks.metric == "output_shape")]
        assert len(shape) == 1 and not shape.passed.iloc[0] and "!= stock" in shape.detail.iloc[0]
        assert "INCORRECT" in patched.reasons.split(",")
    steps = pd.read_parquet(out / "steps.parquet")
    baseline = steps[(steps.arm == "baseline") & (steps.phase == "warm")]
    assert len(baseline) == 6, "the baseline arm's timing must go on without the failed arm"
    assert pd.read_parquet(out / "run.parquet").status.iloc[0] == "complete"


LONG_STEPS = 400  # long enough that timing lasts seconds on CPU (about 200 rounds of blocks)


def _timed_blocks_flushed(out: Path) -> int | None:
    """The highest timed block in steps.parquet (flushed after every round of timed blocks); None if none is.

    The run writes the table (empty) before it starts any worker and replaces it atomically, so by the time it
    announces timing the file is there and whole: a failure to read it fails the test.
    """
    steps = pd.read_parquet(out / "steps.parquet")
    warm = steps[steps.phase == "warm"]
    return int(warm.block.max()) if len(warm) else None


def _stop_inside_timing(process: subprocess.Popen, out: Path, stderr_path: Path, n_blocks: int) -> None:
    """Wait until the run announces its timing phase, then freeze it (SIGSTOP) where the tables prove it is inside it.

    Deterministic, not a race against the clock: the run prints "infer: timing" as timing starts and flushes
    steps.parquet after every round of timed blocks. Frozen after that line, with no timed round flushed yet or the
    last one flushed short of the final block, the run is between two flushes that both lie inside timing, and stays
    there until it is continued. Fails the test with a message if the phase never comes or the run got past it.
    """
    deadline = time.monotonic() + 240
    while "infer: timing" not in stderr_path.read_text(errors="replace"):
        if process.poll() is not None:
            pytest.fail(f"the run ended (exit {process.returncode}) before timing:\n{stderr_path.read_text()}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the run did not reach its timing phase in 240 s:\n{stderr_path.read_text()}")
        time.sleep(0.05)
    process.send_signal(signal.SIGSTOP)
    _, status = os.waitpid(process.pid, os.WUNTRACED)  # SIGSTOP lands asynchronously: wait until it has
    if not os.WIFSTOPPED(status):
        pytest.fail(f"the run ended before it could be interrupted (wait status {status}):\n{stderr_path.read_text()}")
    last = _timed_blocks_flushed(out)
    if last is not None and last >= n_blocks - 1:
        process.kill()
        process.send_signal(signal.SIGCONT)
        pytest.fail(f"the run had flushed its last timed block ({last}) before the test could stop it: "
                    "it was past its timing phase, not inside it")
    # Shown with a failure: a run that then ends as if never signalled lost the signal, it did not get it late.
    print(f"signalled with the run stopped inside timing (last timed block flushed: {last}, of {n_blocks})")


def interrupt(tmp_path: Path, signum: int, times: int = 1) -> tuple[subprocess.CompletedProcess, Path]:
    """Start a long compare, stop it once it is inside its timing phase, send `signum` `times` times back to back
    (the first while it is stopped, so it lands inside timing), wait for it to exit."""
    out = tmp_path / "report"
    # The last --steps wins.
    long_run = [*SMALL, "--patch", "fastsoftmax", "--steps", str(LONG_STEPS), "--out", str(out)]
    n_blocks = -(-LONG_STEPS // int(SMALL[SMALL.index("--block-steps") + 1]))
    # Output to files, not pipes: nothing is read while the test waits, and a full pipe would block the run.
    stdout_path, stderr_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(stdout_path, "w") as stdout, open(stderr_path, "w") as stderr:
        # SIGINT back to its default in the child: a shell that starts jobs in the background (CI scripts do) hands
        # them SIGINT ignored, and Python then installs no KeyboardInterrupt handler at all.
        process = subprocess.Popen([sys.executable, "-m", "e2eprof", "compare", *long_run], stdout=stdout,
                                   stderr=stderr, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        _stop_inside_timing(process, out, stderr_path, n_blocks)
        process.send_signal(signum)  # pending while stopped: delivered inside timing the moment the run continues
        process.send_signal(signal.SIGCONT)
        for _ in range(times - 1):
            process.send_signal(signum)
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.send_signal(signal.SIGCONT)
            process.wait()
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout_path.read_text(),
                                         stderr_path.read_text())
    return result, out


# GNU timeout sends SIGTERM to the command and then to its whole process group: the run gets it twice, the second
# while it is still writing its tables (seen on the H200: run.parquet was left saying "running").
@pytest.mark.parametrize("signum, code, times", [(signal.SIGINT, 130, 1), (signal.SIGTERM, 143, 1),
                                                 (signal.SIGTERM, 143, 2), (signal.SIGINT, 130, 2)],
                         ids=["SIGINT", "SIGTERM", "SIGTERM twice", "SIGINT twice"])
def test_an_interrupted_run_keeps_readable_tables_and_refuses_a_rerun(tmp_path, signum, code, times):
    result, out = interrupt(tmp_path, signum, times)
    assert result.returncode == code, result.stderr
    assert "interrupted" in result.stderr and "Traceback" not in result.stderr
    tables = {p.stem: pd.read_parquet(p) for p in out.glob("*.parquet")}  # every one readable
    assert {"run", "steps", "correctness"} <= set(tables)
    assert len(tables["steps"]) > 0
    assert tables["run"].status.iloc[0] == "interrupted"
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")], "temporary files left behind"
    if signum == signal.SIGINT and times == 1:  # the rerun rules, once: they read the tables, not the signal
        again = subprocess.run([sys.executable, "-m", "e2eprof", "compare", *SMALL, "--patch", "fastsoftmax",
                                "--out", str(out)], capture_output=True, text=True, timeout=120)
        assert again.returncode == 2 and "--force" in again.stderr and "interrupted" in again.stderr
        resumed = subprocess.run([sys.executable, "-m", "e2eprof", "compare", *SMALL, "--patch", "fastsoftmax",
                                  "--out", str(out), "--resume"], capture_output=True, text=True, timeout=120)
        # --resume continues only the same run: these options differ from the interrupted run's (tests/e2eprof/test_resume.py)
        assert resumed.returncode == 2 and f"started with --steps {LONG_STEPS}" in resumed.stderr, resumed.stderr
        assert len(resumed.stderr.strip().splitlines()) == 1 and "Traceback" not in resumed.stderr
