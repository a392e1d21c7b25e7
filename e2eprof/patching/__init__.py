"""The patching engine: apply, count, verify and revert any declared `Patch`.

- install:    apply_patch, AppliedPatch (revert), ModuleProxy: putting a replacement in place and taking it out
- targets:    target resolution, signature_mismatch, check_targets, check_model_fits: does a patch fit a model
- recorder:   CallRecorder and OpCheck: the counted, optionally verified call installed at each target
- checks:     the anti-cheat helpers a verified call runs (poisoned allocator, bit-identical compares, layouts)
- signatures: argument-signature keys and their formatting
- rows:       CALL_CHECK_METRICS and call_check_rows, the report rows of the anti-cheat checks

Callers import from `e2eprof.patching`; the names below are its public surface.
"""

from e2eprof.patching.install import AppliedPatch, ModuleProxy, apply_patch
from e2eprof.patching.recorder import REPLACED_RANGE_PREFIX, CallRecorder, OpCheck
from e2eprof.patching.rows import CALL_CHECK_METRICS, call_check_rows
from e2eprof.patching.signatures import format_signature
from e2eprof.patching.targets import check_model_fits, check_targets, signature_mismatch

__all__ = [
    "CALL_CHECK_METRICS",
    "REPLACED_RANGE_PREFIX",
    "AppliedPatch",
    "CallRecorder",
    "ModuleProxy",
    "OpCheck",
    "apply_patch",
    "call_check_rows",
    "check_model_fits",
    "check_targets",
    "format_signature",
    "signature_mismatch",
]
