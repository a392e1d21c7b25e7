"""A stop request (Ctrl-C, SIGTERM) that cannot be lost.

The signal handler raises KeyboardInterrupt where the main thread is, as Python's own Ctrl-C does. But a signal that
lands while a finalizer runs (a `__del__`, a weakref callback, garbage collection) has its exception "ignored":
Python prints it and carries on. The run would then time to the end with the signal already spent (a second one is
ignored on purpose, see cli._stop_once) and exit as if nothing had been asked. So the handler also records the
request, and the runner calls `check()` before it sends a worker its next command: a request whose raise was
swallowed is raised there. Unwinding from a delivered raise sends no new commands, so nothing is raised twice.
"""

from __future__ import annotations

import signal


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, so the run stops through the same path as Ctrl-C."""


_requested: int | None = None  # the signal of a stop asked for and not yet handled


def request(signum: int) -> None:
    global _requested
    _requested = signum


def clear() -> None:
    """The stop was handled (or a new run starts in this process): forget it."""
    global _requested
    _requested = None


def exception(signum: int) -> KeyboardInterrupt:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def check() -> None:
    """Raise a stop that was asked for but whose own raise was swallowed."""
    if _requested is not None:
        raise exception(_requested)
