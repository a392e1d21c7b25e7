"""The correctness gate and the checks after timing: the fp64 reference and every arm's capture, the patched arm's
per-call checks, its trained-like capture, a diagnosis when it failed early, and its revalidation after timing."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from e2eprof.harness.arm_process import ArmFailed
from e2eprof.checks.correctness import compare_captures, op_check_rows
from e2eprof.distributed import ranks as dp
from e2eprof.harness.pool import Pending, call, overlapped, release_caches
from e2eprof.harness.unit import Unit
from e2eprof.patching import call_check_rows
from e2eprof.sweep import is_oom
from e2eprof.harness.protocol import Capture, Reference, TrainedLike, scratch_path
from e2eprof.harness.scratch import located


# The arm whose capture is sent first and awaited last: the compiled model captures in eval mode, a second graph to
# compile (seconds on a warm compile cache, half a minute on an empty one), and nothing else waits for its outputs.
LATE_ARM = "compile"


@contextmanager
def correctness_gate(unit: Unit) -> Iterator[None]:
    """fp64 reference from the stock baseline, captures of every arm on pristine weights, op checks in the patched arm.

    The captures of the other arms overlap the baseline's fp64 reference; the baseline's own capture follows it. The
    compile arm's capture runs on beside all of that, the comparisons and the caller's block (the candidates'
    trained-like checks): its outputs are compared when the block ends, still before any warm-up.
    """
    config, workload, processes, state, patch, scratch = unit.config, unit.workload, unit.processes, unit.state, unit.patch, unit.scratch
    live = unit.first  # correctness is a property of an arm's code: its first process is checked
    candidates = unit.candidate_arms()

    def capture(arm):
        return Capture(workload, scratch_path(str(scratch), arm, workload, "capture"), verify=arm in candidates)

    late = Pending(processes, state, LATE_ARM, capture(LATE_ARM)) if LATE_ARM in live() else None
    first = {arm: capture(arm) for arm in live() if arm not in ("baseline", LATE_ARM)}
    reference_path = scratch_path(str(scratch), "fp64", workload, "reference")
    first["baseline"] = Reference(workload, reference_path, host_fallback=False)
    results = overlapped(processes, state, first)
    reference = reference_alone(processes, state, workload, reference_path, results.pop("baseline", None))
    if "baseline" in live():
        baseline = call(processes, state, "baseline", capture("baseline"))
        if baseline is not None:
            results["baseline"] = baseline
    captures = {}
    for arm in live():  # in the arms' order, so the rows are too
        result = results.get(arm)
        if result:
            captures[arm] = _capture_rows(unit, arm, result)
    device_type = str(config.device).split(":")[0]
    if reference and reference.get("device", device_type) != device_type:
        state.correctness.append({  # informational: where the trusted values came from
            "workload": workload, "arm": "baseline", "tensor": "-", "metric": "reference_on_host", "value": 1.0,
            "tolerance": math.nan, "passed": True,
            "detail": f"the fp64 reference did not fit on {config.device}, not even once the other arms' processes had "
                      f"emptied their caches, and ran on the host instead (same model, weights and batch)"})
    if reference and "baseline" in captures:
        # Each candidate's outputs judged by its own patch's tolerances; the stock arms by the first candidate's.
        later = [a for a in candidates[1:] if a in captures]
        state.correctness += compare_captures(workload, reference["path"], {a: p for a, p in captures.items() if a not in later},
                                              patch, config.precision)
        for arm in later:
            state.correctness += _compared_beside_baseline(unit, reference["path"], captures["baseline"], arm, captures[arm])
    yield
    result = late.result() if late is not None else None
    if result:
        path = _capture_rows(unit, LATE_ARM, result)
        if reference and "baseline" in captures:
            state.correctness += _compared_beside_baseline(unit, reference["path"], captures["baseline"], LATE_ARM, path)


def _compared_beside_baseline(unit: Unit, reference_path: str, baseline_path: str, arm: str, path: str) -> list[dict]:
    """One arm's comparison with the fp64 reference, made beside the baseline's capture and judged by the arm's
    own patch's tolerances (unit.patch_of): that arm's rows only (the baseline's are recorded once, with the rest)."""
    rows = compare_captures(unit.workload, reference_path, {"baseline": baseline_path, arm: path}, unit.patch_of(arm),
                            unit.config.precision)
    return [r for r in rows if r["arm"] == arm]


def _capture_rows(unit: Unit, arm: str, result: dict) -> str:
    """Record what an arm's capture found on its own (op checks, a candidate's per-call checks, data-parallel ranks'
    agreement); return the capture's path, for the comparison with the reference."""
    workload, state = unit.workload, unit.state
    state.correctness += op_check_rows(workload, arm, result["op_checks"])
    if arm in unit.candidate_arms():
        state.correctness += call_check_rows(workload, arm, result["op_checks"])
    state.correctness += dp.rank_agreement_rows(workload, arm, result, dp.agreement_tolerance(unit.patch_of(arm), unit.config.precision))
    return result["path"]


def reference_alone(processes, state, workload: str, path: str, first: dict | None) -> dict | None:
    """The fp64 reference's answer. One that ran out of device memory beside the other arms' captures is asked again
    once those are done and every other process has emptied its allocator's cache, as overlapped retries an arm;
    only if it runs out alone too does it move to the host, where it takes minutes instead of seconds (gpt2 training
    on an 80 GB card, reports/2026-12-07-h100-run-time/)."""
    if not first or not first.get("out_of_memory"):
        return first
    release_caches(processes, state, keep=("baseline",))
    return call(processes, state, "baseline", Reference(workload, path, host_fallback=True))


def trained_like_check(unit: Unit) -> None:
    """Each candidate arm's calls checked once more on trained-like weights and a padded batch (workloads.trained_like):
    the values real checkpoints give kernels, which a random-init model never does. One row each, metric "trained_like"."""
    for arm in unit.candidate_arms():
        _trained_like(unit, arm)


def _trained_like(unit: Unit, arm: str) -> None:
    workload, processes, state = unit.workload, unit.processes, unit.state
    if arm not in processes or arm in state.arm_failures:
        return
    result = call(processes, state, arm, TrainedLike(workload))
    if result is None:
        return  # recorded as arm_failed
    if result.get("skipped"):
        state.correctness.append({"workload": workload, "arm": arm, "tensor": "-", "metric": "trained_like",
                                  "value": 0.0, "tolerance": 0.0, "passed": True,
                                  "detail": f"not run: {result['skipped']}"})
        return
    checks = result["op_checks"]
    rows = op_check_rows(workload, arm, checks) + call_check_rows(workload, arm, checks)
    failed = [r for r in rows if not r["passed"]]
    calls = sum(c["calls"] for c in checks)
    detail = (f"{result['transform']}: " + ("; ".join(f"{r['metric']} {r['tensor']}: {r['detail'].removeprefix(r['tensor'] + ': ')}" for r in failed[:3])
                                            if failed else f"{calls} calls of {len(checks)} signatures checked in "
                                                           f"{result['seconds']:.2f} s, none wrong"))
    state.correctness.append({"workload": workload, "arm": arm, "tensor": "-", "metric": "trained_like",
                              "value": float(len(failed)), "tolerance": 0.0, "passed": not failed,
                              "detail": detail[:600] if checks else f"{result['transform']}: the patch was not called"})


def diagnose_failure(unit: Unit, arm: str = "patched") -> None:
    """A candidate arm raised before its checks ran: run its verified capture anyway, to say why.

    An output the model cannot use (on another device, of another shape) makes the model's next op raise in the
    cold step, before any per-call check; the verified call records such a finding and hands the model the stock
    output, so this capture usually finishes and names the check (output_device, ...) next to the arm_failed row.
    A worker that died, or a kernel that raises again, tells nothing more: the arm_failed row stands alone.
    """
    workload, processes, state, scratch = unit.workload, unit.processes, unit.state, unit.scratch
    failure = state.arm_failures.get(arm)
    if failure is None or failure.kind != "error" or is_oom(failure):
        return
    try:
        result = processes[arm].call(Capture(workload, scratch_path(str(scratch), arm, workload, "diagnosis"), verify=True))
    except ArmFailed:
        return
    state.correctness += op_check_rows(workload, arm, result["op_checks"])
    state.correctness += call_check_rows(workload, arm, result["op_checks"])


def revalidate(unit: Unit) -> None:
    """After timing, check each candidate arm once more: a kernel right during the gate but wrong later fails here.

    The same capture as the gate (pristine weights, the gate's batch, so the fp64 reference still applies), with
    every call checked again, including with new contents at the same addresses. One row, metric "revalidation".
    """
    for arm in unit.candidate_arms():
        _revalidate(unit, arm)


def _revalidate(unit: Unit, arm: str) -> None:
    config, workload, processes, state, scratch = unit.config, unit.workload, unit.processes, unit.state, unit.scratch
    if arm not in processes or arm in state.arm_failures:
        return
    # extended=False: the gate moved these signatures' inputs to other shapes and ranges, not needed again.
    result = call(processes, state, arm, Capture(workload, scratch_path(str(scratch), arm, workload, "revalidate"),
                                                 verify=True, extended=False))
    if result is None:
        return  # recorded as arm_failed
    rows = op_check_rows(workload, arm, result["op_checks"]) + call_check_rows(workload, arm, result["op_checks"])
    reference = Path(located(scratch_path(str(scratch), "fp64", workload, "reference")))
    baseline = Path(located(scratch_path(str(scratch), "baseline", workload, "capture")))
    if reference.exists() and baseline.exists():
        rows += [r for r in compare_captures(workload, str(reference), {"baseline": str(baseline), arm: result["path"]},
                                             unit.patch_of(arm), config.precision) if r["arm"] == arm]
    failed = [r for r in rows if not r["passed"]]
    detail = "; ".join(f"{r['metric']} {r['tensor']}: {r['detail']}" for r in failed[:3]) if failed else \
        f"{len(rows)} checks passed again after timing"
    state.correctness.append({"workload": workload, "arm": arm, "tensor": "-", "metric": "revalidation",
                              "value": float(len(failed)), "tolerance": 0.0, "passed": not failed, "detail": detail})
