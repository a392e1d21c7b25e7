"""Timed blocks in alternating arm order, and the rule that stops them: the interval's width, never its side of 1."""

from __future__ import annotations

import math
import time

import pandas as pd

from e2eprof.analysis import stats
from e2eprof.candidates import arm_names
from e2eprof.config import CompareConfig
from e2eprof.distributed import ranks as dp
from e2eprof.harness.pool import call
from e2eprof.harness.protocol import Block
from e2eprof.harness.unit import Unit
from e2eprof.analysis.summary import summary_interval


def timed_blocks(unit: Unit) -> None:
    """Interleaved blocks: the fixed --steps first, then more rounds until the interval is tight enough.

    The stopping rule looks at the interval's width only, never at which side of 1 it lies: stopping when a
    result looks significant would inflate false alarms, stopping on precision does not.
    """
    config, workload, processes, state, events, live = unit.config, unit.workload, unit.processes, unit.state, unit.events, unit.live
    events("timing", workload=workload, total=config.n_blocks * len(live()))
    order = live()
    started = time.perf_counter()
    block, reason = 0, "fixed steps"
    while True:
        steps = min(config.block_steps, config.steps - block * config.block_steps) if block < config.n_blocks else config.block_steps
        # Alternate the order each round (ABC, CBA, ...): ABBA for two arms, balanced for three.
        for arm in (order if block % 2 == 0 else list(reversed(order))):
            state.steps += call(processes, state, arm, Block(workload, block, steps)) or []
            events("advance", workload=workload)
        state.flush_steps()  # each round's steps on disk at once; the other tables after the phase
        block += 1
        if block < config.n_blocks:
            continue
        reason = stop_reason(config, state, workload, block, time.perf_counter() - started)
        if reason:
            break
        events("timing_extend", workload=workload, total=(block + 1) * len(live()))
    state.timing[(state.point.id, workload)] = {"blocks": block, "stop_reason": reason, "timing_s": time.perf_counter() - started}


# How many budgets' worth of projected timing make the target interval "out of reach" (see stop_reason).
OUT_OF_REACH = 2.0


def stop_reason(config, state, workload: str, blocks: int, elapsed: float) -> str | None:
    """Why timing may stop now, or None to run another round."""
    if config.budget_seconds <= 0:
        return "fixed steps"
    # Several candidates: the one still measured whose interval is widest decides (the last to settle).
    candidates = [c for c in arm_names(config) if c not in state.arm_failures]
    if not candidates or "baseline" in state.arm_failures:
        return "arm failed"
    candidates = [c for c in candidates if (c, workload) not in state.out_of_memory]
    if not candidates or ("baseline", workload) in state.out_of_memory:
        return "out of memory"
    here = state.point.id  # rows of earlier points carry their own id; this point's may not be stamped yet
    warm = dp.slowest_rank([s for s in state.steps if s["workload"] == workload and s["phase"] == "warm"
                            and s.get("point", here) == here])
    base = [s for s in warm if s["arm"] == "baseline"]
    by_arm = {c: [s for s in warm if s["arm"] == c] for c in candidates}
    if len(base) >= 2 and all(len(rows) >= 2 for rows in by_arm.values()):
        # The summary's own interval (its process noise included: the device's floor or what these replicas show),
        # so timing stops on the interval the verdict will use.
        whole = max((summary_interval(pd.DataFrame(base + rows), workload, config, c, n_boot=1000)
                     for c, rows in by_arm.items()), key=stats.ci_halfwidth_rel)
        if stats.ci_halfwidth_rel(whole) <= config.target_half_width:
            return "target interval reached"
        ci = stats.without_process_noise(whole)
        noise = whole.process_noise
        # Precision, not the result, again: the within-run part of an interval narrows about as 1/sqrt(time) while
        # the process-noise part does not, so timing stops when even OUT_OF_REACH budgets would not bring the whole
        # interval to the target (host-bound decoding on the H200: +-7% after 30 s, which the 60 s budget cannot
        # bring near 1%), or at once when the process noise alone is wider than the target.
        floor = stats.process_noise_half_width(noise, config.confidence)
        if floor >= config.target_half_width:
            return "target below the process noise"
        needed = math.sqrt(config.target_half_width ** 2 - floor ** 2)
        if elapsed * (stats.ci_halfwidth_rel(ci) / needed) ** 2 > OUT_OF_REACH * config.budget_seconds:
            return "target out of reach within the budget"
    if elapsed >= config.budget_seconds:
        return "time budget spent"
    if blocks >= config.max_blocks:
        return "block limit reached"
    return None
