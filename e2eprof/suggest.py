"""'Did you mean' hints for unknown names: the one place that picks the closest known names.

Plain Python (no torch), so the command line, the configuration and the workloads can all use it cheaply.
Every hint is a suffix for an error message that is already being raised; '' when nothing is close.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

CUTOFF = 0.6  # difflib's similarity ratio a known name needs to be offered


def close_matches(name: str, known: Iterable[str], n: int = 1) -> list[str]:
    """Up to `n` known names closest to `name`, the closest first."""
    return difflib.get_close_matches(name, list(known), n=n, cutoff=CUTOFF)


def suggest(name: str, known: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest known name, or '' when nothing is close."""
    close = close_matches(name, known)
    return f" (did you mean '{close[0]}'?)" if close else ""


def nearby(name: str, names: Iterable[str]) -> str:
    """'; nearby: a, b, c' for the (up to 3) names closest to `name`, leaving out dunder names, or ''.

    For attribute and module names, where several close ones are worth showing (softmax, log_softmax).
    """
    close = close_matches(name, [n for n in names if not n.startswith("__")], n=3)
    return f"; nearby: {', '.join(close)}" if close else ""
