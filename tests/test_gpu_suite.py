"""benchmarks/gpu_suite.sh's DEADLINE: on a machine lent for a fixed time, the suite stops a command at the deadline
and starts none after it, so it ends (and what ran comes back) before the lease does."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Stands in for python3: answers env_txt's version probe at once and spends 60 s on any real command, so only the
# suite's own deadline can end it early.
_SLOW_PYTHON = """#!/usr/bin/env bash
if [ "$1" = -c ]; then echo "python (stand-in)"; exit 0; fi
sleep 60
"""


def _suite(tmp_path: Path, python: str, env: dict[str, str], *parts: str) -> tuple[subprocess.CompletedProcess, float]:
    """Run the suite with PYTHON pointing at a stand-in script `python`, TIMEOUT and DEADLINE unset unless in `env`."""
    stand_in = tmp_path / "python"
    stand_in.write_text(python)
    stand_in.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if k not in ("DEADLINE", "TIMEOUT")}
    start = time.monotonic()
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_suite.sh"), str(tmp_path / "out"), *parts],
                          cwd=ROOT, env={**base, "PYTHON": str(stand_in), **env}, capture_output=True, text=True,
                          timeout=120)
    return done, time.monotonic() - start


def test_a_command_running_at_the_deadline_is_stopped_and_later_ones_are_skipped(tmp_path):
    done, seconds = _suite(tmp_path, _SLOW_PYTHON, {"DEADLINE": "3"}, "default", "bert")
    assert seconds < 30, f"the suite ran {seconds:.0f} s past a 3 s deadline"
    stopped = (tmp_path / "out" / "default" / "status.txt").read_text()
    assert "exit 124" in stopped  # timeout's code: stopped, not failed
    skipped = (tmp_path / "out" / "bert" / "status.txt").read_text()
    assert "skipped" in skipped and not (tmp_path / "out" / "bert" / "bert-base-fastgelu.log").exists()
    assert done.returncode == 124


def test_without_a_deadline_nothing_is_cut_short(tmp_path):
    done, _ = _suite(tmp_path, '#!/usr/bin/env bash\nif [ "$1" = -c ]; then exit 0; fi\nsleep 1\n', {}, "default")
    assert done.returncode == 0
    assert "exit 0" in (tmp_path / "out" / "default" / "status.txt").read_text()


def test_a_deadline_that_is_not_whole_seconds_is_refused_in_one_line(tmp_path):
    done, _ = _suite(tmp_path, _SLOW_PYTHON, {"DEADLINE": "5m"}, "default")
    assert done.returncode == 2
    assert done.stderr.strip() == "gpu_suite: DEADLINE must be whole seconds, not '5m'"
    assert not (tmp_path / "out").exists()  # refused before anything ran
