"""A worker's start-up clock (worker.process_age): seconds since its own process started, read from /proc."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_a_process_age_lies_between_its_own_sleep_and_the_parents_wall_clock():
    started = time.time()
    out = subprocess.run([sys.executable, "-c", "import time; time.sleep(0.6); "
                          "from e2eprof.harness.worker import process_age; print(process_age())"],
                         capture_output=True, text=True, check=True)
    wall = time.time() - started
    age = float(out.stdout.split()[-1])
    assert 0.6 <= age <= wall + 0.05  # /proc's start time is in clock ticks (10 ms)

