"""The joins that turn telemetry samples into per-step, per-block and per-arm columns: pure numpy/pandas on the steps
table and the telemetry rows (`join_steps`, `block_energy`, `arm_balance`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from e2eprof.trackers.telemetry_columns import TELEMETRY_COLUMNS, THROTTLE_MASK


def telemetry_frame(rows: list[dict]) -> pd.DataFrame:
    """Rows -> a typed frame: unix_ns int64, reasons and bytes nullable Int64, power_kind string, the rest float64."""
    frame = pd.DataFrame(list(rows), columns=list(TELEMETRY_COLUMNS)) if rows else pd.DataFrame(
        {c: [] for c in TELEMETRY_COLUMNS})
    frame = frame.copy()
    for column in TELEMETRY_COLUMNS:
        if column == "unix_ns":
            frame[column] = frame[column].astype("int64")
        elif column in ("clock_event_reasons", "mem_used_bytes"):
            frame[column] = pd.to_numeric(frame[column]).astype("Int64")
        elif column == "power_kind":
            frame[column] = frame[column].astype("string")
        else:
            frame[column] = pd.to_numeric(frame[column]).astype("float64")
    return frame


def _sorted_samples(telemetry: pd.DataFrame) -> pd.DataFrame:
    if telemetry is None or len(telemetry) == 0:
        return telemetry_frame([])
    return telemetry.sort_values("unix_ns", kind="stable").reset_index(drop=True)


def _float(telemetry: pd.DataFrame, column: str) -> np.ndarray:
    if column not in telemetry:
        return np.full(len(telemetry), np.nan)
    return pd.to_numeric(telemetry[column]).astype("float64").to_numpy(na_value=np.nan)


def _windows(t: np.ndarray, start: np.ndarray, end: np.ndarray, tolerance_ns: float):
    """Sample index ranges [lo, hi) per step: the samples inside [start, end], else the single sample nearest the
    step's middle if within tolerance_ns (a step shorter than the sample interval), else none."""
    lo = np.searchsorted(t, start, "left")
    hi = np.searchsorted(t, end, "right")
    inside = hi - lo
    match = np.where(inside > 0, "window", "none").astype(object)
    empty = np.flatnonzero(inside == 0)
    if len(empty) and len(t):
        mid = (start[empty] + end[empty]) // 2
        right = np.clip(np.searchsorted(t, mid), 0, len(t) - 1)
        left = np.clip(right - 1, 0, len(t) - 1)
        pick = np.where(np.abs(t[left] - mid) <= np.abs(t[right] - mid), left, right)
        near = np.abs(t[pick] - mid) <= tolerance_ns
        lo[empty[near]] = pick[near]
        hi[empty[near]] = pick[near] + 1
        match[empty[near]] = "nearest"
    return lo, hi, inside, match


def _ragged_index(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(group, sample index) of every sample of every window, concatenated in window order."""
    n = hi - lo
    group = np.repeat(np.arange(len(lo)), n)
    index = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n) + np.repeat(lo, n)
    return group, index


def _min_median(group: np.ndarray, values: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-group min and median of values (NaN dropped; NaN for a group with none), without a Python loop."""
    keep = ~np.isnan(values)
    group, values = group[keep], values[keep]
    order = np.lexsort((values, group))
    values = values[order]
    counts = np.bincount(group, minlength=n_groups)
    starts = np.cumsum(counts) - counts
    has = counts > 0
    minimum = np.full(n_groups, np.nan)
    median = np.full(n_groups, np.nan)
    minimum[has] = values[starts[has]]
    median[has] = (values[starts[has] + (counts[has] - 1) // 2] + values[starts[has] + counts[has] // 2]) / 2
    return minimum, median


def join_steps(steps: pd.DataFrame, telemetry: pd.DataFrame, *,
               nearest_tolerance_ns: int | None = None) -> pd.DataFrame:
    """Steps with telemetry columns over each step's [start_unix_ns, end_unix_ns].

    Adds: sm_clock_min_mhz, sm_clock_median_mhz, gpu_temp_c (median), mem_temp_c (median), power_median_mw,
    throttle_reasons (bitwise OR of the reasons seen, nullable Int64), throttled (any THROTTLE_MASK bit; nullable
    boolean, NA when no reasons were read), telemetry_samples (samples inside the step) and telemetry_match:
    'window' (samples inside the step), 'nearest' (none inside, so the single sample nearest the step's middle, if
    within ``nearest_tolerance_ns``, default twice the median sample spacing) or 'none' (all NaN/NA).
    """
    samples = _sorted_samples(telemetry)
    t = samples["unix_ns"].to_numpy(dtype="int64")
    start = steps["start_unix_ns"].to_numpy(dtype="int64")
    end = steps["end_unix_ns"].to_numpy(dtype="int64")
    if nearest_tolerance_ns is None:
        nearest_tolerance_ns = 2 * float(np.median(np.diff(t))) if len(t) > 1 else 0
    lo, hi, inside, match = _windows(t, start, end, nearest_tolerance_ns)
    group, index = _ragged_index(lo, hi)
    n = len(steps)

    out = steps.copy()
    sm_min, sm_median = _min_median(group, _float(samples, "sm_clock_mhz")[index], n)
    out["sm_clock_min_mhz"] = sm_min
    out["sm_clock_median_mhz"] = sm_median
    out["gpu_temp_c"] = _min_median(group, _float(samples, "gpu_temp_c")[index], n)[1]
    out["mem_temp_c"] = _min_median(group, _float(samples, "mem_temp_c")[index], n)[1]
    out["power_median_mw"] = _min_median(group, _float(samples, "power_mw")[index], n)[1]

    reasons = _float(samples, "clock_event_reasons")[index]
    known = ~np.isnan(reasons)
    ored = np.zeros(n, dtype=np.int64)
    seen = np.bincount(group[known], minlength=n) > 0
    if known.any():
        g, r = group[known], reasons[known].astype(np.int64)
        firsts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])  # group is ascending: each group is one run
        ored[g[firsts]] = np.bitwise_or.reduceat(r, firsts)
    throttle_reasons = pd.array(ored, dtype="Int64")
    throttle_reasons[~seen] = pd.NA
    throttled = pd.array((ored & THROTTLE_MASK) != 0, dtype="boolean")
    throttled[~seen] = pd.NA
    out["throttle_reasons"] = throttle_reasons
    out["throttled"] = throttled
    out["telemetry_samples"] = inside.astype("int64")
    out["telemetry_match"] = match
    return out


def _interp_counter(t: np.ndarray, e: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The energy counter at times ``at``, linear between the samples where it changed.

    The counter moves in steps every ~10-100 ms, so interpolating the raw staircase would be off by up to one
    update's energy at each end; the first sample showing a new value marks (within one interval) when it was
    reached. NaN outside the sampled span.
    """
    keep = ~np.isnan(e)
    t, e = t[keep], e[keep]
    if len(t) < 2:
        return np.full(len(at), np.nan)
    changed = np.r_[True, e[1:] != e[:-1]]
    changed[-1] = True  # keep the last sample so the span out to it is covered
    value = np.interp(at, t[changed], e[changed])
    value[(at < t[0]) | (at > t[-1])] = np.nan
    return value


def block_energy(steps: pd.DataFrame, telemetry: pd.DataFrame) -> pd.DataFrame:
    """Energy per timed block: one row per (workload, arm, block) with block >= 0.

    Cold and warm-up steps (block -1) are left out: they are spread over the run (cold step, correctness, warm-up)
    with other arms' work in between, so the span from their first start to last end is not theirs alone.
    Columns: workload, arm, block, steps, start_unix_ns, end_unix_ns, duration_s, energy_j (counter delta over the
    span, interpolated at its ends; NaN when the samples do not cover the span), energy_per_step_j, mean_power_w,
    energy_updates (counter changes seen inside the span: below ~10 the energy is coarse).
    """
    columns = ["workload", "arm", "block", "steps", "start_unix_ns", "end_unix_ns", "duration_s", "energy_j",
               "energy_per_step_j", "mean_power_w", "energy_updates"]
    timed = steps[steps["block"] >= 0]
    if len(timed) == 0:
        return pd.DataFrame({c: [] for c in columns})
    blocks = (timed.groupby(["workload", "arm", "block"], sort=False)
              .agg(steps=("start_unix_ns", "size"), start_unix_ns=("start_unix_ns", "min"),
                   end_unix_ns=("end_unix_ns", "max"))
              .reset_index())
    samples = _sorted_samples(telemetry)
    t = samples["unix_ns"].to_numpy(dtype="int64")
    e = _float(samples, "energy_mj")
    start = blocks["start_unix_ns"].to_numpy(dtype="int64")
    end = blocks["end_unix_ns"].to_numpy(dtype="int64")
    energy_j = (_interp_counter(t, e, end) - _interp_counter(t, e, start)) / 1e3
    valid = ~np.isnan(e)
    change_t = t[valid][1:][np.diff(e[valid]) != 0]
    blocks["duration_s"] = (end - start) / 1e9
    blocks["energy_j"] = energy_j
    blocks["energy_per_step_j"] = energy_j / blocks["steps"].to_numpy()
    blocks["mean_power_w"] = energy_j / blocks["duration_s"].to_numpy()
    blocks["energy_updates"] = np.searchsorted(change_t, end, "right") - np.searchsorted(change_t, start, "left")
    return blocks[columns]


def arm_balance(joined_steps: pd.DataFrame, *, clock_tolerance: float = 0.02, temp_tolerance_c: float = 5.0,
                baseline: str = "baseline") -> list[dict]:
    """Did the arms run under the same conditions? One row per (workload, arm) over its warm steps.

    Warm steps are phase == 'warm' (or block >= 0 without a phase column). Per arm: the median over steps of each
    step's median SM clock and GPU temperature, and the share of steps throttled. Each arm is compared with
    ``baseline``: ``clock_imbalance`` when |clock / baseline clock - 1| > clock_tolerance, ``temp_imbalance`` when
    |temp - baseline temp| > temp_tolerance_c, ``throttled`` when any step was. A flag is None when it cannot be
    judged (no baseline, no telemetry). The thresholds are in every row so a summary can state them.
    """
    if not len(joined_steps):  # every arm failed before timing: nothing to balance
        return []
    if "phase" in joined_steps:
        warm = joined_steps[joined_steps["phase"] == "warm"]
    else:
        warm = joined_steps[joined_steps["block"] >= 0]
    rows = []
    for workload in dict.fromkeys(warm["workload"]):
        mine = warm[warm["workload"] == workload]
        per_arm = {}
        for arm in dict.fromkeys(mine["arm"]):
            s = mine[mine["arm"] == arm]
            clock = s["sm_clock_median_mhz"].astype("float64").dropna()
            temp = s["gpu_temp_c"].astype("float64").dropna()
            throttled = s["throttled"].astype("boolean").dropna()
            per_arm[arm] = {
                "steps": len(s), "steps_with_telemetry": int(len(clock)),
                "sm_clock_median_mhz": float(clock.median()) if len(clock) else math.nan,
                "gpu_temp_median_c": float(temp.median()) if len(temp) else math.nan,
                "throttled_steps": int(throttled.sum()),
                "throttled_share": float(throttled.mean()) if len(throttled) else math.nan,
            }
        base = per_arm.get(baseline)
        for arm, m in per_arm.items():
            clock_diff = m["sm_clock_median_mhz"] / base["sm_clock_median_mhz"] - 1 if base else math.nan
            temp_diff = m["gpu_temp_median_c"] - base["gpu_temp_median_c"] if base else math.nan
            rows.append({
                "workload": workload, "arm": arm, "baseline_arm": baseline, **m,
                "clock_diff_rel": clock_diff,
                "clock_imbalance": None if math.isnan(clock_diff) else bool(abs(clock_diff) > clock_tolerance),
                "temp_diff_c": temp_diff,
                "temp_imbalance": None if math.isnan(temp_diff) else bool(abs(temp_diff) > temp_tolerance_c),
                "throttled": None if math.isnan(m["throttled_share"]) else bool(m["throttled_share"] > 0),
                "clock_tolerance": clock_tolerance, "temp_tolerance_c": temp_tolerance_c,
            })
    return rows
