"""The command's start-up row in phases.parquet: dated from the process's start once, from the call after that."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest

from e2eprof import startup


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_process_start_is_the_interpreters_own_start():
    # A child that sleeps 1.5 s before asking: its start lies 1.5 s or more in its past, not at the question.
    code = "import time; time.sleep(1.5); from e2eprof import startup; print(time.time_ns() - startup.process_start_unix_ns())"
    age_ns = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 1.5e9 <= age_ns < 10e9


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("sh") is None, reason="reads /proc; needs sh")
def test_a_program_a_shell_execs_after_another_does_not_count_the_other(tmp_path):
    # `sh -c "A && B"` runs B by exec in the shell's process, which started before A: here A spends 1.5 s of CPU,
    # and B, asking at once, must not count them as its own start-up.
    busy = "import time; t = time.time() + 1.5\nwhile time.time() < t: pass"
    ask = ("import time; from e2eprof import startup; "
           "print(time.time_ns() - startup.process_start_unix_ns(), time.time_ns() - startup.command_start_unix_ns())")
    script = tmp_path / "busy.py"
    script.write_text(busy)
    out = subprocess.run(["sh", "-c", f'"{sys.executable}" "{script}" && exec "{sys.executable}" -c "{ask}"'],
                         capture_output=True, text=True, check=True).stdout.split()
    process_age_ns, command_age_ns = int(out[0]), int(out[1])
    assert process_age_ns >= 1.5e9  # what /proc alone says: the shell's start, before A
    assert command_age_ns < 1.0e9  # the interpreter's own start-up only


def test_the_first_command_counts_from_the_process_start_and_later_ones_from_their_call(monkeypatch):
    monkeypatch.setattr(startup, "_first_command", True)
    monkeypatch.setattr(startup, "e2eprof_is_the_program", lambda: True)
    monkeypatch.setattr(startup, "command_start_unix_ns", lambda: time.time_ns() - 5_000_000_000)
    before = time.time_ns()
    startup.mark_entry()
    first = startup.take_entry()
    assert first is not None and before - first >= 4.9e9
    assert startup.take_entry() is None  # taken once: a second run of the same command counts no start-up

    startup.mark_entry()  # the process's second command (the self-benchmark runs e2eprof in-process)
    second = startup.take_entry()
    assert second is not None and second >= before


def test_without_proc_the_call_itself_is_the_start(monkeypatch):
    monkeypatch.setattr(startup, "_first_command", True)
    monkeypatch.setattr(startup, "process_start_unix_ns", lambda: None)
    before = time.time_ns()
    startup.mark_entry()
    assert startup.take_entry() >= before


def test_a_program_calling_e2eprof_counts_from_the_call(monkeypatch):
    # pytest is the program here, as benchmarks/self_benchmark.py is when it runs e2eprof in-process.
    assert not startup.e2eprof_is_the_program()
    monkeypatch.setattr(startup, "_first_command", True)
    monkeypatch.setattr(startup, "process_start_unix_ns", lambda: time.time_ns() - 5_000_000_000)
    before = time.time_ns()
    startup.mark_entry()
    assert startup.take_entry() >= before


@pytest.mark.parametrize(("argv0", "expected"), [("/usr/local/bin/e2eprof", True), ("/src/e2eprof/__main__.py", True),
                                                 ("benchmarks/self_benchmark.py", False), ("", False)])
def test_which_programs_are_e2eprof(monkeypatch, argv0, expected):
    monkeypatch.setattr(sys, "argv", [argv0])
    assert startup.e2eprof_is_the_program() is expected
