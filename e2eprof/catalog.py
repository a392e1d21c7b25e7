"""What a run can name: model presets, workloads, patches and stock reference arms.

One source for `e2eprof list` and the command line's --help, read without importing torch or any patch's code.
"""

from __future__ import annotations

from e2eprof.config import KNOWN_WORKLOADS, PRECISIONS, REFERENCE_ARMS
from e2eprof.registry import _entry_points
from e2eprof.registry import builtin_patches as _builtin_patches
from e2eprof.workloads.presets import PRESETS


def model_presets() -> tuple[str, ...]:
    return tuple(PRESETS)


def workloads() -> tuple[str, ...]:
    return KNOWN_WORKLOADS


def builtin_patches() -> tuple[str, ...]:
    return tuple(_builtin_patches())


def installed_patches() -> tuple[str, ...]:
    """Patches other installed packages register under the entry-point group e2eprof.patches."""
    return tuple(_entry_points())


def reference_arms() -> tuple[str, ...]:
    return REFERENCE_ARMS


def precisions() -> tuple[str, ...]:
    return PRECISIONS
