"""What the parent derives from per-rank rows: the step time of the slowest rank, the spread between ranks, the share
of communication in the profile, and whether every rank ended a step with the same gradients.

Single-process runs have one rank (0), so everything here is the identity or empty for them.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

import pandas as pd
import torch
from safetensors.torch import load_file

from e2eprof.checks.correctness import PRECISION_DTYPE_NAME
from e2eprof.checks.tensorcheck import error_norms, ratio_of_norms

# A step is one (arm, replica) process's: replicas of an arm are separate processes, not ranks of one step.
STEP_KEY = ("point", "workload", "arm", "replica", "phase", "block", "step")
# Collective work as the profiler names it: NCCL kernels on a GPU (ncclDevKernel_AllReduce_..., ncclKernel_...);
# on a CPU, gloo runs collectives on its own threads as async "gloo:all_reduce" / "gloo:all_gather" events.
COMM_MARKERS = ("nccl", "gloo:")


def slowest_rank(steps: list[dict]) -> list[dict]:
    """One row per step: the row of the rank that took longest (a data-parallel step ends when its slowest rank
    does). Rows keep their order of first appearance; a step recorded by one rank is returned as it is."""
    slowest: dict[tuple, dict] = {}
    for row in steps:
        key = tuple(row.get(k) for k in STEP_KEY)
        kept = slowest.get(key)
        if kept is None or row["wall_ns"] > kept["wall_ns"]:
            slowest[key] = row
    if len(slowest) == len(steps):
        return steps
    return list(slowest.values())


def slowest_rank_frame(steps: pd.DataFrame) -> pd.DataFrame:
    """slowest_rank for a steps.parquet frame (report readers: diff, render)."""
    if "rank" not in steps or steps["rank"].nunique() <= 1:
        return steps
    keys = [k for k in STEP_KEY if k in steps]
    return steps.sort_values("wall_ns", kind="stable").drop_duplicates(keys, keep="last").sort_index()


def rank_spread(steps: list[dict], workload: str, arm: str, point: str | None = None) -> dict:
    """Per-rank warm medians of one arm: {'ranks', 'rank_spread' (slowest/fastest median), 'slowest_rank'}."""
    walls: dict[int, list[int]] = defaultdict(list)
    for row in steps:
        if (row["workload"] == workload and row["arm"] == arm and row["phase"] == "warm"
                and (point is None or row.get("point", point) == point)):
            walls[row.get("rank", 0)].append(row["wall_ns"])
    if not walls:
        return {"ranks": 0, "rank_spread": math.nan, "slowest_rank": None}
    medians = {rank: statistics.median(w) for rank, w in walls.items()}
    slowest = max(medians, key=medians.get)
    return {"ranks": len(medians), "rank_spread": medians[slowest] / min(medians.values()), "slowest_rank": slowest}


def by_rank(profile: dict) -> list[tuple[int, dict]]:
    """(rank, ProfileResult dict) for every rank of one arm's profile; a single process's is rank 0's."""
    ranks = profile.get("by_rank")
    return list(enumerate(ranks)) if ranks else [(0, profile)]


def comm_us(profile: dict) -> float:
    """Communication time per step in one rank's profile: NCCL kernels on a GPU, gloo's collective ops on a CPU."""
    if profile["device_type"] == "cuda":
        return sum(k["total_us"] for k in profile["kernels"] if "nccl" in k["kernel"].lower())
    return float(profile.get("comm_cpu_us", 0.0))


def comm_share(profile: dict) -> float:
    """Communication time over the step (device time on a GPU, wall time on a CPU), averaged over ranks."""
    shares = []
    for _, result in by_rank(profile):
        total = result["total_device_us"] if result["device_type"] == "cuda" else result["step_wall_us"]
        if total and math.isfinite(total):
            shares.append(comm_us(result) / total)
    return statistics.fmean(shares) if shares else math.nan


def attach_rank_columns(summary: list[dict], steps: list[dict], profiles: dict) -> None:
    """ranks, rank_spread, slowest_rank and comm_share into each summary row (profiles keyed (point, workload, arm))."""
    shares = {(p.id, w, a): comm_share(r) for (p, w, a), r in profiles.items()}
    for row in summary:
        if row.get("n", 0):
            row.update(rank_spread(steps, row["workload"], row["arm"], row.get("point")))
        row["comm_share"] = shares.get((row.get("point"), row["workload"], row["arm"]), math.nan)


def rank_agreement_rows(workload: str, arm: str, capture: dict, tolerance: float) -> list[dict]:
    """Every rank ends the captured step with rank 0's gradients (after the all-reduce / full gather).

    Loss and logits are left out: each rank computed them on its own shard. One row per rank > 0, with the largest
    relative-norm difference over all gradients.
    """
    paths = capture.get("rank_paths") or []
    if len(paths) < 2:
        return []
    first = load_file(paths[0])
    rows = []
    for rank, path in enumerate(paths[1:], start=1):
        other = load_file(path)
        worst, worst_key = 0.0, "-"
        # Both ways: a gradient only one rank holds is a disagreement too.
        for key in sorted(k for k in {*first, *other} if k.startswith("grad/")):
            if key not in other or key not in first or other[key].shape != first[key].shape:
                worst, worst_key = math.inf, key
                break
            # The norms below skip non-finite entries, so NaN/Inf must first sit in the same places on both ranks.
            if not torch.equal(torch.isfinite(other[key]), torch.isfinite(first[key])):
                worst, worst_key = math.inf, key
                break
            error = ratio_of_norms(*error_norms(other[key], first[key]))
            if not error <= worst:  # NaN counts as the worst
                worst, worst_key = error, key
        rows.append({"workload": workload, "arm": arm, "tensor": worst_key, "metric": "rank_agreement",
                     "value": float(worst), "tolerance": tolerance, "passed": bool(worst <= tolerance),
                     "detail": f"rank {rank} vs rank 0: largest gradient difference after the collective"})
    return rows


def agreement_tolerance(patch, precision: str) -> float:
    """Ranks hold the same reduced gradients up to the order of the reduction: the patch's floor for the dtype."""
    return patch.tolerance_for(PRECISION_DTYPE_NAME[precision])
