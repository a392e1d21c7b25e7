"""What worker processes write to stderr, passed on to ours through one filter.

Workers inherit a pipe as their stderr (fd 2, so output from C++ reaches it too); a thread in the parent copies it
to the real stderr line by line. Two kinds of line are held back:
- third-party chatter with nothing for the user: kineto's `USDT: ... profiler_start` / `profiler_stop` and
  `STAGE: ... Completed Stage` markers, printed by every worker on every profiled step, and nanobind's leak report
  as a worker's interpreter exits;
- the same warning again from another process: every arm's worker builds the same model, so transformers' and
  Python's warnings would come once per process (six times on a GPU). Each distinct warning is shown once.
Everything else passes, in order, as written: tracebacks, a crashing worker's last words, a kernel's own prints.
The parent reads the pipe, not the worker, so even a worker that dies abruptly has its output shown.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import uuid
from contextlib import contextmanager
from typing import Iterator

NOISE = (
    re.compile(r"^USDT:.*\] profiler_(start|stop)\s*$"),
    re.compile(r"^STAGE:.*\] Completed Stage: "),
    # Triton's MLIR bindings report the objects still alive when a worker's interpreter exits (dozens of lines per
    # worker, every run, on triton 3.9): a leak report about a process that is ending, nothing about the kernel.
    re.compile(r"^nanobind: (leaked \d+ \w+!|this is likely caused by a reference counting issue)"),
    re.compile(r"^ - (leaked (instance|type|function) |\.\.\. skipped remainder)"),
    re.compile(r"^See https://nanobind\.readthedocs\.io/"),
)
# A warning line: transformers' logger ("[transformers] ...") or Python's warnings module ("path:12: XWarning: ...").
WARNING = re.compile(r"^\[transformers\] |^\S.*:\d+: \w*Warning: ")
# The line Python's warnings module prints under a warning: the source line that raised it, indented.
WARNING_SOURCE = re.compile(r"^\s+\S")


def is_noise(line: str) -> bool:
    return any(pattern.search(line) for pattern in NOISE)


class LineFilter:
    """Decides, line by line, what is shown: not noise, each warning once, and a hidden warning's source line too."""

    def __init__(self) -> None:
        self.seen_warnings: set[str] = set()
        self._hiding_source = False

    def keep(self, line: str) -> bool:
        text = line.rstrip("\n")
        if self._hiding_source:
            self._hiding_source = False
            if WARNING_SOURCE.match(text):
                return False
        if is_noise(text):
            return False
        if WARNING.search(text):
            if text in self.seen_warnings:
                self._hiding_source = True
                return False
            self.seen_warnings.add(text)
        return True


class _Relay:
    """The pipe, the copying thread and the real stderr it writes to."""

    def __init__(self) -> None:
        self.target = os.dup(2)  # the real stderr, as it was when the first worker started
        self.read_fd, self.write_fd = os.pipe()
        os.set_inheritable(self.write_fd, False)  # given to workers only as their fd 2
        self.filter = LineFilter()
        self._markers: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._copy, name="e2eprof-worker-stderr", daemon=True).start()

    def _copy(self) -> None:
        with os.fdopen(self.read_fd, "rb", buffering=0) as pipe:
            pending = b""
            while chunk := pipe.read(65536):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    self._line(raw)
            if pending:
                self._line(pending)

    def _line(self, raw: bytes) -> None:
        text = raw.decode("utf-8", errors="replace")
        with self._lock:
            # A drain marker ends whatever line a worker left unfinished (no newline), so it may close a line.
            marker = next((m for m in self._markers if text.endswith(m)), None)
            event = self._markers.pop(marker) if marker is not None else None
        if event is not None:
            text = text[: -len(marker)]
        if (text or event is None) and self.filter.keep(text):  # a worker's own blank line passes too
            os.write(self.target, text.encode("utf-8", errors="replace") + b"\n")
        if event is not None:  # only now: whatever came before the marker is out
            event.set()

    @contextmanager
    def as_fd2(self) -> Iterator[None]:
        """Processes started inside this block get the pipe as their stderr; ours is restored after."""
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(self.write_fd, 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)

    def drain(self, timeout_s: float) -> bool:
        """Wait until everything written to the pipe so far has been passed on (a marker line comes through)."""
        marker = f"e2eprof-drain-{uuid.uuid4().hex}"
        event = threading.Event()
        with self._lock:
            self._markers[marker] = event
        os.write(self.write_fd, marker.encode() + b"\n")
        return event.wait(timeout_s)


_relay: _Relay | None = None
_relay_lock = threading.Lock()


def _get() -> _Relay:
    global _relay
    with _relay_lock:
        if _relay is None:
            _relay = _Relay()
        return _relay


@contextmanager
def relayed() -> Iterator[None]:
    """Start worker processes inside this block so their stderr goes through the filter."""
    with _get().as_fd2():
        yield


def drain(timeout_s: float = 5.0) -> None:
    """Pass on what stopped workers wrote before the caller prints more (their last lines come before the summary)."""
    if _relay is not None:
        _relay.drain(timeout_s)
