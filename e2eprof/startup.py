"""When the current e2eprof command began, so that phases.parquet can account for its start-up.

A run's recorded phases begin when its workers start. Before that the command has already paid for the interpreter,
its imports and the checks before measuring (model config, patch, sequence length): seconds that the self-benchmark's
cost part could only report as "unattributed". The first command of a process is dated from the process's own start,
read from Linux's /proc; a command called from another program (the self-benchmark runs e2eprof in-process), or a
later command in the same process, from the moment it was called.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

_entered_unix_ns: int | None = None
_first_command = True


def process_start_unix_ns() -> int | None:
    """This process's start as a Unix time in ns (Linux: /proc, about 10 ms resolution), or None where unknown."""
    try:
        with open("/proc/self/stat") as f:
            # Field 22 is the start in clock ticks after boot; the command name (field 2) may hold spaces, so count
            # from the closing parenthesis that ends it.
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime_s = float(f.read().split()[0])
        age_s = uptime_s - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    if not 0 <= age_s < 30 * 24 * 3600:
        return None
    return time.time_ns() - int(age_s * 1e9)


def command_start_unix_ns() -> int | None:
    """When this program began: the process's start, unless the process ran other programs before it.

    A shell runs the last command of `sh -c "pip install -e . && e2eprof compare ..."` (or of a `( ... )` subshell)
    by exec in its own process, whose start then lies before pip's whole install. Linux keeps no exec time, but a
    process that waited for other programs first has their CPU time in its children's usage, which exec keeps: then
    the start is counted back by the CPU time this process has used, a lower bound (the interpreter's start-up is
    mostly CPU; its disk waits are left out) that never includes another program's minutes.
    """
    started = process_start_unix_ns()
    if started is None:
        return None
    try:
        import resource
    except ImportError:  # not a Unix: nothing to tell, and no /proc above either
        return started
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    if children.ru_utime + children.ru_stime == 0:
        return started
    own = resource.getrusage(resource.RUSAGE_SELF)
    return max(started, time.time_ns() - int((own.ru_utime + own.ru_stime) * 1e9))


def e2eprof_is_the_program() -> bool:
    """Whether this process was started as e2eprof (the console script or `python -m e2eprof`), not a program that
    calls e2eprof.cli.main() after its own work, whose start-up is not e2eprof's."""
    program = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    return program.name == "e2eprof" or (program.name == "__main__.py" and program.parent.name == "e2eprof")


def mark_entry() -> None:
    """Called as a command begins: e2eprof's first command in its own process counts from the process's start."""
    global _entered_unix_ns, _first_command
    now = time.time_ns()
    started = command_start_unix_ns() if _first_command and e2eprof_is_the_program() else None
    _entered_unix_ns = started if started is not None and started <= now else now
    _first_command = False


def take_entry() -> int | None:
    """When the current command began, once: a second run in the same command (or compare() called as a library
    afterwards) gets None, so no start-up is counted twice."""
    global _entered_unix_ns
    entered, _entered_unix_ns = _entered_unix_ns, None
    return entered
