"""Why the end-to-end gain is what it is: op-level differences between arms and an Amdahl explanation.

Runs in the parent on the profiling tables (ProfileResult dicts, see e2eprof.trackers.profiling). With f the baseline share
of step time spent in the replaced region and s the region's speedup (both from the profiles), Amdahl predicts the
step speedup 1 / (1 - f + f / s). `explain` puts that next to the measured speedup and names the cause of any gap.

Speedups are baseline time / patched time: above 1 means the patched arm is faster.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from e2eprof.trackers.profiling import REPLACED_PREFIX

KEYS = ["workload", "module", "op", "direction"]

# Thresholds of the cause rules (see explain).
SURVIVES_ABS = 0.01  # measured within max(1 %, 25 % of the predicted gain) of predicted
SURVIVES_REL = 0.25
DILUTION_F = 0.05  # below this share even an infinite s gives at most 1/(1 - 0.05) = 1.053x
LAUNCH_BOUND_IDLE = 0.3  # the patched device sits idle this share of the step: saved kernel time is not saved wall time
SIDE_EFFECT_SHARE = 0.01  # time outside the replaced region grew by more than 1 % of the baseline step
BACKWARD_SLOWER = 1.01  # the replaced region's backward counts as slower above 1 % growth
IMPLAUSIBLE_MARGIN = 1.02  # measured above amdahl_bound(f) * this: the step gained more than the region held


def amdahl(f: float, s: float) -> float:
    """Step speedup when a share f of the step gets s times faster: 1 / (1 - f + f / s).

    f must be in [0, 1] and s > 0 (s may be inf: the region vanishes); NaN in, NaN out.
    """
    if math.isnan(f) or math.isnan(s):
        return math.nan
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"f must be a share in [0, 1], got {f}")
    if not s > 0:
        raise ValueError(f"s must be a speedup > 0, got {s}")
    denominator = 1.0 - f + f / s
    return math.inf if denominator <= 0 else 1.0 / denominator


def amdahl_bound(f: float) -> float:
    """The most a step can gain from speeding up a share f of it: 1 / (1 - f) (s -> infinity)."""
    return amdahl(f, math.inf)


# ---- op-level differences -------------------------------------------------------------------------------------


def ops_frame(result: Any, *, workload: str, arm: str) -> pd.DataFrame:
    """One arm's ops rows (ProfileResult or its dict) as a frame labelled with workload and arm."""
    frame = pd.DataFrame(_get(result, "ops") or [])
    if frame.empty:
        frame = pd.DataFrame(columns=["module", "op", "input_shapes", "in_replaced", "direction", "count",
                                      "self_device_us", "self_cpu_us", "kernels"])
    return frame.assign(workload=workload, arm=arm)


def op_diff(ops: pd.DataFrame, *, baseline: str = "baseline", patched: str = "patched") -> pd.DataFrame:
    """Per (workload, module, op, direction): baseline_us, patched_us, delta_us (patched - baseline), status.

    Rows of other arms are ignored; input shapes and in_replaced are summed over. Times are self device time, or
    self CPU time for a workload whose device times are all zero or NaN (a CPU run); `time_basis` says which.
    status: 'added' (only in the patched arm), 'removed' (only in the baseline), 'changed' (in both; delta may be 0).
    Sorted by |delta_us|, largest first.
    """
    columns = [*KEYS, "time_basis", "baseline_us", "patched_us", "delta_us", "status"]
    frame = ops[ops["arm"].isin([baseline, patched])]
    if frame.empty:
        return pd.DataFrame(columns=columns)
    parts = []
    for workload, rows in frame.groupby("workload", sort=False):
        if not (rows["arm"] == patched).any() or not (rows["arm"] == baseline).any():
            continue  # an arm with no profile here (it failed, or ran out of memory): no diff, not every op "removed"
        device = pd.to_numeric(rows["self_device_us"], errors="coerce") if "self_device_us" in rows else None
        use_device = device is not None and bool((device.fillna(0) != 0).any())
        basis = "device" if use_device else "cpu"
        times = device if use_device else pd.to_numeric(rows["self_cpu_us"], errors="coerce")
        rows = rows.assign(_us=times.fillna(0.0))
        summed = rows.groupby([*KEYS, "arm"], sort=False)["_us"].sum().unstack("arm")
        part = pd.DataFrame(index=summed.index)
        part["baseline_us"] = summed[baseline] if baseline in summed else math.nan
        part["patched_us"] = summed[patched] if patched in summed else math.nan
        part["time_basis"] = basis
        parts.append(part.reset_index())
    if not parts:
        return pd.DataFrame(columns=columns)
    out = pd.concat(parts, ignore_index=True)
    in_base, in_patch = out["baseline_us"].notna(), out["patched_us"].notna()
    out["status"] = "changed"
    out.loc[~in_base & in_patch, "status"] = "added"
    out.loc[in_base & ~in_patch, "status"] = "removed"
    out["delta_us"] = out["patched_us"].fillna(0.0) - out["baseline_us"].fillna(0.0)
    out = out.reindex(out["delta_us"].abs().sort_values(ascending=False, kind="stable").index)
    return out[columns].reset_index(drop=True)


# ---- explanation ----------------------------------------------------------------------------------------------


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


def _num(obj: Any, key: str) -> float:
    value = _get(obj, key, math.nan)
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _positive(x: float) -> bool:
    return math.isfinite(x) and x > 0


def explain(workload: str, baseline: Any, patched: Any, measured_speedup: float, *, top: int = 3,
            measured_low: float = math.nan) -> dict:
    """Amdahl prediction from the two arms' profiles next to the measured speedup, and the cause of any gap.

    baseline / patched: ProfileResult or its dict. measured_speedup: baseline step time / patched step time.
    f = baseline replaced / baseline total (device time; CPU time when the baseline has no device time),
    s = baseline replaced / patched replaced, predicted = amdahl(f, s), bound = amdahl_bound(f).

    cause, first that applies:
      implausible   measured > bound * 1.02: more gain than the whole region held; suspicious. With
                    `measured_low` (the speedup interval's lower bound) the interval must clear it, so noise alone
                    never makes a gain implausible (the verdict then says IMPLAUSIBLE_GAIN).
      survives      measured within max(1 %, 25 % of the predicted gain) of predicted, with f >= 0.05;
      dilution      ... the same, but f < 0.05: the win is real and the rest of the step dilutes it.
    otherwise (a gap):
      side effects  time outside the replaced region grew by more than 1 % of the baseline step (top ops named);
      backward loss the region's forward got faster but its backward slower;
      launch-bound  the patched device is idle more than 30 % of the step;
      dilution      f < 0.05;
      unexplained   none of the above.
    `causes` lists every rule that holds. Returns f, s, predicted, measured, bound, cause, causes, detail and the
    numbers behind them.
    """
    basis = "device" if _positive(_num(baseline, "total_device_us")) else "cpu"
    b_total, p_total = _num(baseline, f"total_{basis}_us"), _num(patched, f"total_{basis}_us")
    b_rep, p_rep = _num(baseline, f"replaced_{basis}_us"), _num(patched, f"replaced_{basis}_us")
    out: dict[str, Any] = {"workload": workload, "time_basis": basis, "measured": float(measured_speedup)}

    if not (_positive(b_total) and math.isfinite(b_rep) and b_rep >= 0):
        return out | {"f": math.nan, "s": math.nan, "predicted": math.nan, "bound": math.nan, "cause": "unknown",
                      "causes": ["unknown"],
                      "detail": f"the baseline profile has no {basis} time to take a share of; nothing to predict"}
    f = min(max(b_rep / b_total, 0.0), 1.0)
    if b_rep == 0:
        s = math.nan
    elif math.isfinite(p_rep) and p_rep > 0:
        s = b_rep / p_rep
    else:
        s = math.inf  # the region vanished from the patched profile (or its range is missing: see detail)
    predicted = amdahl(f, s) if not math.isnan(s) else 1.0
    bound = amdahl_bound(f)
    measured = float(measured_speedup)
    out |= {"f": f, "s": s, "predicted": predicted, "bound": bound}

    # Evidence for each rule.
    tolerance = max(SURVIVES_ABS, SURVIVES_REL * abs(predicted - 1.0))
    within = math.isfinite(measured) and abs(measured - predicted) <= tolerance
    surely = float(measured_low) if math.isfinite(measured_low) else measured  # the gain the interval is sure of
    implausible = math.isfinite(surely) and surely > bound * IMPLAUSIBLE_MARGIN
    outside_growth = (p_total - p_rep) - (b_total - b_rep)
    side_effects = math.isfinite(outside_growth) and outside_growth > SIDE_EFFECT_SHARE * b_total
    b_fwd, b_bwd = _num(baseline, f"replaced_fwd_{basis}_us"), _num(baseline, f"replaced_bwd_{basis}_us")
    p_fwd, p_bwd = _num(patched, f"replaced_fwd_{basis}_us"), _num(patched, f"replaced_bwd_{basis}_us")
    backward_loss = (all(math.isfinite(x) for x in (b_fwd, b_bwd, p_fwd, p_bwd))
                     and p_fwd < b_fwd and p_bwd > b_bwd * BACKWARD_SLOWER)
    idle = _num(patched, "idle_share")
    launch_bound = math.isfinite(idle) and idle > LAUNCH_BOUND_IDLE
    dilution = f < DILUTION_F

    grown = _grown_ops(workload, baseline, patched, top) if side_effects else []
    holds = {"implausible": implausible, "survives": within and not dilution, "side effects": side_effects,
             "backward loss": backward_loss, "launch-bound": launch_bound, "dilution": dilution}
    causes = [name for name, ok in holds.items() if ok]
    if implausible:
        cause = "implausible"
    elif within:
        cause = "dilution" if dilution else "survives"
    else:
        cause = next((c for c in ("side effects", "backward loss", "launch-bound", "dilution") if holds[c]),
                     "unexplained")

    lines = [f"{basis} time: the replaced region is {100 * f:.1f}% of the baseline step (f={f:.3f}) and "
             f"{_fmt_x(s)} faster in the patched arm (s); Amdahl predicts {predicted:.3f}x, at most "
             f"{_fmt_x(bound)} for any s; measured {measured:.3f}x."]
    if implausible:
        lines.append(f"implausible: measured {measured:.3f}x exceeds the bound {_fmt_x(bound)}: the step gained more "
                     "than the region held (timing artefact, work skipped, or the region's range misses calls).")
    if within and not implausible:
        lines.append(f"survives: measured is within {tolerance:.3f} of predicted.")
    if side_effects:
        named = ", ".join(f"{g['module']} {g['op']} ({g['direction']}) +{g['delta_us']:.1f} us" for g in grown)
        lines.append(f"side effects: time outside the replaced region grew by {outside_growth:.1f} us per step "
                     f"({100 * outside_growth / b_total:.1f}% of the baseline step)"
                     + (f"; top: {named}." if named else "."))
    if backward_loss:
        lines.append(f"backward loss: the region's forward went {b_fwd:.1f} -> {p_fwd:.1f} us but its backward "
                     f"{b_bwd:.1f} -> {p_bwd:.1f} us per step.")
    if launch_bound:
        lines.append(f"launch-bound: the patched device is idle {100 * idle:.0f}% of the step, so saved kernel "
                     "time does not shorten the step.")
    if dilution:
        lines.append(f"dilution: the region is only {100 * f:.1f}% of the step; even an infinite speedup gives "
                     f"{_fmt_x(bound)}.")
    if b_rep == 0:
        lines.append("the baseline profile shows no time in the replaced region: its range is missing or the "
                     "function was never called.")
    elif not (math.isfinite(p_rep) and p_rep > 0):
        lines.append("the patched profile shows no time in the replaced region: its range is missing or the "
                     "region did no work (s taken as infinite).")
    if cause == "unexplained":
        lines.append("unexplained: none of dilution, launch-bound, side effects or backward loss accounts for the gap.")

    return out | {"cause": cause, "causes": causes, "detail": " ".join(lines), "tolerance": tolerance,
                  "outside_growth_us": outside_growth, "patched_idle_share": idle,
                  "replaced_us": {"baseline_fwd": b_fwd, "baseline_bwd": b_bwd, "patched_fwd": p_fwd,
                                  "patched_bwd": p_bwd},
                  "grown_ops": grown}


def _grown_ops(workload: str, baseline: Any, patched: Any, top: int) -> list[dict]:
    """The `top` ops outside the replaced region whose time grew most from baseline to patched."""
    ops = pd.concat([ops_frame(baseline, workload=workload, arm="baseline"),
                     ops_frame(patched, workload=workload, arm="patched")], ignore_index=True)
    if ops.empty:
        return []
    outside = ~ops["in_replaced"].astype(bool) & ~ops["module"].astype(str).str.startswith(REPLACED_PREFIX)
    diff = op_diff(ops[outside])
    diff = diff[diff["delta_us"] > 0].head(top)
    return diff[["module", "op", "direction", "baseline_us", "patched_us", "delta_us", "status"]].to_dict("records")


def _fmt_x(x: float) -> str:
    return "inf" if math.isinf(x) else ("nan" if math.isnan(x) else f"{x:.3f}x")
