"""Where a patch can run at all: on which workloads (Patch.workloads) and on which device (Patch.requires_triton).

Checked before anything is measured, so asking for what the patch cannot do is one line and exit code 2, not a
crashed arm or a verdict about a kernel that never ran.
"""

from __future__ import annotations

import os

from e2eprof.errors import PatchError
from e2eprof.patch import Patch


def check_device(patch: Patch, device: str) -> None:
    """A Triton-only patch on a CPU device runs only under the Triton interpreter: refuse it otherwise."""
    if patch.requires_triton and not str(device).startswith("cuda") and os.environ.get("TRITON_INTERPRET") != "1":
        raise PatchError(f"patch '{patch.name}' has only Triton kernels: run it on a CUDA device, or on the CPU "
                         f"under the Triton interpreter (TRITON_INTERPRET=1)")


def fit_workloads(patch: Patch, workloads: tuple[str, ...], defaulted: bool) -> tuple[tuple[str, ...], str | None]:
    """The workloads to run and a note saying what was left out, or None.

    defaulted: the workloads are the default set, not the user's choice; those the patch does not apply to are
    dropped with a note. Workloads the user named explicitly must all be supported.
    """
    if not patch.workloads:
        return workloads, None
    unsupported = [w for w in workloads if w not in patch.workloads]
    if not unsupported:
        return workloads, None
    kept = tuple(w for w in workloads if w in patch.workloads)
    if not defaulted or not kept:
        raise PatchError(f"patch '{patch.name}' applies to the workloads {', '.join(patch.workloads)} only, not "
                         f"{', '.join(unsupported)}; choose with --workload {patch.workloads[0]}")
    return kept, f"patch '{patch.name}' applies to {', '.join(patch.workloads)} only: not running {', '.join(unsupported)}"
