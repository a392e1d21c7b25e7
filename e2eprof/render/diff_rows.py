"""The rows of `diff`: per (point, workload, arm) the time ratio B/A, per (point, workload) the change in the kernel's
speedup, each with a bootstrap interval widened by process noise, a Holm-adjusted p-value and a status.

The two runs are independent samples, so nothing pairs across them: each run's arms are resampled on their own.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from e2eprof.analysis import stats
from e2eprof.render.diff_records import (BELOW_MARGIN, FASTER, NO_SIGNIFICANT_DIFFERENCE, ONLY_IN_A, ONLY_IN_B,
                                         OUT_OF_MEMORY_IN_A, OUT_OF_MEMORY_IN_B, SLOWER, SPEEDUP_DROPPED, SPEEDUP_GREW,
                                         TOO_FEW_SAMPLES, DiffConfig, RunRecord, _key, common_points, is_sweep)


def _significant(low: float, high: float, p_adjusted: float, alpha: float, no_change: float) -> bool:
    """Both tests agree: the adjusted p-value is small and the interval leaves out "no change"."""
    return p_adjusted <= alpha and (low > no_change or high < no_change)


def arm_status(low: float, high: float, p_adjusted: float, alpha: float, min_change: float) -> str:
    """Status of a time ratio B/A. Its direction comes from the interval, which lies wholly on one side of 1."""
    if not _significant(low, high, p_adjusted, alpha, 1.0):
        return NO_SIGNIFICANT_DIFFERENCE
    if low > 1.0:
        return SLOWER if low > 1.0 + min_change else BELOW_MARGIN
    # Faster beyond the margin mirrors slower beyond it: A/B above 1 + m, i.e. B/A below 1 / (1 + m).
    return FASTER if high < 1.0 / (1.0 + min_change) else BELOW_MARGIN


def speedup_status(low: float, high: float, p_adjusted: float, alpha: float, min_change: float) -> str:
    """Status of a speedup difference B - A (in speedup points: 1.05x -> 1.04x is -0.01)."""
    if not _significant(low, high, p_adjusted, alpha, 0.0):
        return NO_SIGNIFICANT_DIFFERENCE
    if high < 0.0:
        return SPEEDUP_DROPPED if high < -min_change else BELOW_MARGIN
    return SPEEDUP_GREW if low > min_change else BELOW_MARGIN


def arm_rows(a: RunRecord, b: RunRecord, config: DiffConfig) -> list[dict]:
    """One row per (point, workload, arm) in either run; both-run rows carry B/A, its interval and Holm-adjusted p."""
    rows = []
    for point in dict.fromkeys(a.points + b.points):
        for workload in dict.fromkeys(a.workloads + b.workloads):
            arms_a, arms_b = a.arms(point, workload), b.arms(point, workload)
            for arm in dict.fromkeys(arms_a + arms_b):
                rows.append(_arm_row(a, b, config, point, workload, arm, arm in arms_a, arm in arms_b))
    _holm_into(rows)
    for row in rows:
        if row["status"] is None:
            row["status"] = arm_status(row["ci_low"], row["ci_high"], row["p_adjusted"], config.alpha, config.min_change)
    return rows


def _arm_row(a, b, config, point, workload, arm, in_a: bool, in_b: bool) -> dict:
    xa, xb = a.samples(point, workload, arm, config.metric), b.samples(point, workload, arm, config.metric)
    row = {"kind": "arm", "point": point, "workload": workload, "arm": arm, "n_a": len(xa), "n_b": len(xb),
           "median_a_ms": float(np.median(xa)) if len(xa) else math.nan,
           "median_b_ms": float(np.median(xb)) if len(xb) else math.nan,
           "ratio": math.nan, "ci_low": math.nan, "ci_high": math.nan, "mde": math.nan, "p": math.nan, "status": None}
    if not in_b:
        row["status"] = OUT_OF_MEMORY_IN_B if (point, workload, arm) in b.out_of_memory else ONLY_IN_A
    elif not in_a:
        row["status"] = OUT_OF_MEMORY_IN_A if (point, workload, arm) in a.out_of_memory else ONLY_IN_B
    elif min(len(xa), len(xb)) < 2:
        row["status"] = TOO_FEW_SAMPLES  # a bootstrap of one sample would be a false certainty
    else:
        # ratio_of_medians_ci divides median(baseline) by median(candidate): B first gives B/A, a time ratio.
        ci = stats.ratio_of_medians_ci(xb, xa, confidence=config.confidence, n_boot=config.n_boot, seed=config.seed)
        # A and B are other processes: each one's own offset is a difference the bootstrap cannot see.
        # Differences between days or cards come on top and are not in it: the environment flags name them.
        noise = stats.pooled_process_noise(a.noise_floor(workload), a.processes(point, workload, arm),
                                           b.noise_floor(workload), b.processes(point, workload, arm))
        ci = stats.with_process_noise(ci, noise)
        row.update(ratio=ci.ratio, ci_low=ci.low, ci_high=ci.high, mde=stats.minimum_detectable_effect(ci),
                   p=stats.mann_whitney(xb, xa).p_two_sided, process_noise=noise)
    return row


def _holm_into(rows: list[dict]) -> None:
    """Holm-adjust the rows' p-values as one family; rows without a test get NaN."""
    tested = [r for r in rows if not math.isnan(r["p"])]
    for row, adjusted in zip(tested, stats.holm([r["p"] for r in tested])):
        row["p_adjusted"] = adjusted
    for row in rows:
        row.setdefault("p_adjusted", math.nan)


def speedup_rows(a: RunRecord, b: RunRecord, config: DiffConfig) -> list[dict]:
    """Per (point, workload) in both runs: the kernel's speedup (baseline / patched median) in A and in B, and B - A."""
    rows = []
    units = [(p, w) for p in common_points(a, b) for w in a.workloads if w in b.workloads]
    sweep = is_sweep(a, b)
    for point, workload in units:
        per_run, replicates = {}, {}
        # One generator per (point, workload), seeded by its name, so its numbers do not depend on the others.
        rng = np.random.default_rng([config.seed, zlib.crc32(_key(sweep, point, workload).encode())])
        for run in (a, b):
            base, patched = (run.samples(point, workload, arm, config.metric) for arm in ("baseline", "patched"))
            if min(len(base), len(patched)) < 2:
                break
            # Within a run, the same interval `compare` reports (block-paired when there are enough blocks).
            per_run[run.label] = stats.ratio_of_medians_ci(
                base, patched, baseline_blocks=run.blocks(point, workload, "baseline", config.metric),
                candidate_blocks=run.blocks(point, workload, "patched", config.metric), confidence=config.confidence,
                n_boot=config.n_boot, seed=config.seed)
            # Across runs nothing pairs, so each run's arms are resampled independently (stats' own resampler).
            replicates[run.label] = stats._independent_bootstrap(base, patched, config.n_boot, rng)
        if len(per_run) < 2:
            continue  # an arm is missing or nearly empty: its arm row already says so
        diff = replicates["B"] - replicates["A"]
        low, high = np.quantile(diff, [config.alpha / 2, 1 - config.alpha / 2])
        # Two-sided bootstrap p: the share of replicates on the far side of 0, with +1 so it is never exactly 0.
        p = min(1.0, 2 * (min(np.sum(diff <= 0), np.sum(diff >= 0)) + 1) / (config.n_boot + 1))
        # Each run's speedup carries its own process noise, as `compare` reports it; the difference carries both,
        # added in quadrature to each side of the bootstrap interval (absolute speedup units: ratio x noise).
        noise = {run.label: stats.replicated_process_noise(run.noise_floor(workload),
                                                           run.processes(point, workload, "baseline"),
                                                           run.processes(point, workload, "patched")) for run in (a, b)}
        per_run = {label: stats.with_process_noise(ci, noise[label]) for label, ci in per_run.items()}
        sa, sb = per_run["A"], per_run["B"]
        spread = stats.process_noise_half_width(math.hypot(sa.ratio * noise["A"], sb.ratio * noise["B"]), config.confidence)
        point_diff = sb.ratio - sa.ratio
        low = point_diff - math.hypot(max(point_diff - low, 0.0), spread)
        high = point_diff + math.hypot(max(high - point_diff, 0.0), spread)
        rows.append({"kind": "speedup", "point": point, "workload": workload, "arm": "patched",
                     "speedup_a": sa.ratio, "speedup_a_low": sa.low, "speedup_a_high": sa.high,
                     "speedup_b": sb.ratio, "speedup_b_low": sb.low, "speedup_b_high": sb.high,
                     "diff": sb.ratio - sa.ratio, "diff_low": float(low), "diff_high": float(high), "p": p})
    _holm_into(rows)
    for row in rows:
        row["status"] = speedup_status(row["diff_low"], row["diff_high"], row["p_adjusted"], config.alpha, config.min_change)
    return rows
