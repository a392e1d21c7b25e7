"""Whether two runs are the same comparison, what changed between them besides the kernel, and the flags a reader
should see (partial runs, throttling, changed verdicts, points in one grid only, out of memory).
"""

from __future__ import annotations

import math

from e2eprof.render.diff_records import ONLY_IN_A, ONLY_IN_B, RunRecord, _key, common_points, is_sweep


# Environment entries worth naming when they differ, with the label shown to the user.
ENVIRONMENT_FIELDS = (
    ("torch", "torch"), ("torch_cuda", "CUDA (torch build)"), ("transformers", "transformers"), ("triton", "triton"),
    ("driver", "driver"), ("gpu_name", "GPU"), ("gpu_uuid", "GPU UUID (another physical card)"),
    ("gpu_capability", "GPU capability"), ("cpu_model", "CPU"), ("cpu_count", "CPU count"),
    ("torch_threads", "torch threads"), ("python", "python"), ("numpy", "numpy"), ("platform", "platform"),
)
# Settings that change sample sizes or inputs but not what is compared: named as changes, never refused.
SETTING_FIELDS = ("steps", "block_steps", "seed", "reference_arms", "warmup_tolerance", "max_warmup_steps",
                  "max_warmup_seconds", "target_half_width", "budget_seconds", "max_blocks", "confidence", "min_speedup")
# Same tolerance as the arm-balance check inside one run (telemetry.arm_balance): below it clocks count as equal.
CLOCK_TOLERANCE = 0.02


def _spec_name(spec) -> str:
    """A model or patch spec without its folder: the same patch file copied elsewhere is the same patch."""
    return str(spec).rstrip("/").rsplit("/", 1)[-1]


def comparison_identity(run: RunRecord, with_generate: bool) -> dict:
    """The fields that must match for two runs to measure the same thing."""
    c = run.config
    identity = {
        "model": _spec_name(c.get("model")), "patch": _spec_name(c.get("patch")), "batch": _axis(c.get("batch")),
        "seq": _axis(c.get("seq")), "dtype": _axis(c.get("precision")), "device": str(c.get("device", "")).split(":")[0],
        "A/A run": bool(c.get("aa", False)),  # a baseline timed against itself is not the patched comparison
    }
    # A local model folder is named by path only; its shape tells whether the two names hold the same model.
    for key in ("architecture", "n_layer", "n_params", "vocab_size"):
        identity[f"model {key}"] = run.model.get(key)
    if with_generate:  # new_tokens only shapes the decoding workloads
        identity["new_tokens"] = c.get("new_tokens")
    return identity


def _axis(value) -> str | None:
    """A sweep axis as written on the command line: 8, or 1,8,32 for a list."""
    if value is None:
        return None
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def identity_differences(a: RunRecord, b: RunRecord) -> list[str]:
    """'field: A vs B' for each identity field that differs (a field missing from one run's records is skipped).

    The grid counts as the same comparison while the two runs share at least one point: the common points are
    diffed and the others flagged (see point_flags). Grids with no point in common measure different shapes.
    """
    with_generate = any(w in a.workloads and w in b.workloads for w in ("decode", "generate"))
    ia, ib = comparison_identity(a, with_generate), comparison_identity(b, with_generate)
    shared_point = bool(set(a.points) & set(b.points))
    grid = ("batch", "seq", "dtype") if shared_point else ()
    return [f"{k}: {ia[k]} vs {ib[k]}" for k in ia
            if k not in grid and ia[k] is not None and ib[k] is not None and ia[k] != ib[k]]


def _short(value) -> str:
    return "unset" if value is None else str(value)


def _median_column(run: RunRecord, column: str) -> float:
    if column not in run.warm or not run.warm[column].notna().any():
        return math.nan
    return float(run.warm[column].median())


def environment_changes(a: RunRecord, b: RunRecord) -> list[str]:
    """Short lines naming what differs between the runs besides the kernel itself: versions, card, clocks, inputs."""
    changes = []
    for key, label in ENVIRONMENT_FIELDS:
        va, vb = a.environment.get(key), b.environment.get(key)
        if va != vb:
            changes.append(f"{label}: {_short(va)} -> {_short(vb)}")
    vars_a, vars_b = a.environment.get("env_vars") or {}, b.environment.get("env_vars") or {}
    for name in sorted(set(vars_a) | set(vars_b)):
        if vars_a.get(name) != vars_b.get(name):
            changes.append(f"env {name}: {_short(vars_a.get(name))} -> {_short(vars_b.get(name))}")
    sha_a, sha_b = a.run.get("patch_source_sha256"), b.run.get("patch_source_sha256")
    if sha_a != sha_b:
        changes.append(f"patch source sha256: {_short(sha_a)[:12]} -> {_short(sha_b)[:12]}")
    if a.run.get("batch_digest") != b.run.get("batch_digest"):
        changes.append(f"input batch digest: {_short(a.run.get('batch_digest'))[:12]} -> {_short(b.run.get('batch_digest'))[:12]}")
    for key in SETTING_FIELDS:
        if a.config.get(key) != b.config.get(key):
            changes.append(f"{key.replace('_', '-')}: {_short(a.config.get(key))} -> {_short(b.config.get(key))}")
    clock_a, clock_b = _median_column(a, "sm_clock_median_mhz"), _median_column(b, "sm_clock_median_mhz")
    if math.isnan(clock_a) != math.isnan(clock_b):
        changes.append(f"SM clock telemetry: {'none' if math.isnan(clock_a) else f'{clock_a:.0f} MHz'} -> "
                       f"{'none' if math.isnan(clock_b) else f'{clock_b:.0f} MHz'}")
    elif not math.isnan(clock_a) and abs(clock_b / clock_a - 1) > CLOCK_TOLERANCE:
        changes.append(f"SM clock (median of warm steps): {clock_a:.0f} -> {clock_b:.0f} MHz ({(clock_b / clock_a - 1) * 100:+.1f}%)")
    return changes


def _verdict_text(run: RunRecord, point: str, workload: str) -> str | None:
    if run.summary is None or "verdict" not in run.summary:
        return None
    rows = run.summary[(run.summary.point == point) & (run.summary.workload == workload) & (run.summary.arm == "patched")]
    if not len(rows) or not isinstance(rows.iloc[0].verdict, str):
        return None
    reasons = rows.iloc[0].get("reasons")
    return f"{rows.iloc[0].verdict} ({reasons})" if isinstance(reasons, str) and reasons else rows.iloc[0].verdict


def run_flags(a: RunRecord, b: RunRecord, metric: str) -> list[str]:
    """Things a reader should know that do not stop the diff: partial runs, verdicts that changed, throttling."""
    flags = []
    for run in (a, b):
        if run.run.get("status") != "complete":
            flags.append(f"RUN_NOT_COMPLETE: run {run.label} has status '{run.run.get('status')}'")
        if "throttled" in run.warm and run.warm.throttled.fillna(False).astype(bool).any():
            share = run.warm.throttled.fillna(False).astype(bool).mean()
            flags.append(f"THROTTLED: {share * 100:.0f}% of run {run.label}'s timed steps were throttled")
        if metric == "device" and not run.warm.device_ms.notna().any():
            flags.append(f"NO_DEVICE_TIME: run {run.label} recorded no device times (CPU run?); its rows are empty")
    sweep = is_sweep(a, b)
    for workload in dict.fromkeys(a.workloads + b.workloads):
        if workload not in b.workloads:
            flags.append(f"{ONLY_IN_A}: workload '{workload}' was run only in A")
        elif workload not in a.workloads:
            flags.append(f"{ONLY_IN_B}: workload '{workload}' was run only in B")
    for point in common_points(a, b):
        for workload in [w for w in a.workloads if w in b.workloads]:
            va, vb = _verdict_text(a, point, workload), _verdict_text(b, point, workload)
            if va and vb and va != vb:
                flags.append(f"VERDICT_CHANGED: {_key(sweep, point, workload)}: {va} in A, {vb} in B")
    return flags + point_flags(a, b)


def point_flags(a: RunRecord, b: RunRecord) -> list[str]:
    """Points in one grid only (diffed nowhere), and (point, workload)s where an arm ran out of memory."""
    flags = []
    if a.points != b.points and is_sweep(a, b):
        flags.append(f"DIFFERENT_GRID: A has {len(a.points)} point(s), B {len(b.points)}; "
                     f"{len(common_points(a, b))} in common are diffed")
    flags += [f"{ONLY_IN_A}: point '{p}' was run only in A" for p in a.points if p not in b.points]
    flags += [f"{ONLY_IN_B}: point '{p}' was run only in B" for p in b.points if p not in a.points]
    sweep = is_sweep(a, b)
    for point, workload in dict.fromkeys((p, w) for p, w, _ in sorted(a.out_of_memory | b.out_of_memory)):
        where = [f"{', '.join(sorted(arm for p, w, arm in run.out_of_memory if (p, w) == (point, workload)))} in {run.label}"
                 for run in (a, b) if any((p, w) == (point, workload) for p, w, _ in run.out_of_memory)]
        flags.append(f"OUT_OF_MEMORY: {_key(sweep, point, workload)}: {'; '.join(where)}")
    return flags
