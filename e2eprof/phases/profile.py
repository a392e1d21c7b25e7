"""The profile phase: torch.profiler over a few real steps of each arm, after timing."""

from __future__ import annotations

from e2eprof.config import DECODING_WORKLOADS, CompareConfig
from e2eprof.harness.pool import call, overlapped
from e2eprof.harness.protocol import Profile, SummarizeProfile
from e2eprof.harness.unit import Unit


def profile_steps_for(config: CompareConfig, workload: str) -> tuple[int, int]:
    """(warm-up, active) profiled steps for a workload.

    One generate step is new_tokens forward passes, each with the module ranges and shapes the profiler records:
    on the H200 the default 2 + 3 steps of a 32-token decode took 110 s over three arms, a quarter of the whole
    run. One warm-up and one active step already hold new_tokens calls of every op, so decoding gets at most that.
    """
    if workload in DECODING_WORKLOADS:
        return min(config.profile_warmup, 1), min(config.profile_steps, 1)
    return config.profile_warmup, config.profile_steps


def profile_arms(unit: Unit) -> None:
    # The compiled arm is left out: module ranges would break its graphs, so its profile could not be attributed,
    # and profiling it re-traces the model (over a minute for generate on the H200). Its device time per step is
    # in steps.parquet all the same.
    config, workload, processes, state = unit.config, unit.workload, unit.processes, unit.state
    live = unit.first  # a profile describes an arm's code: its first process is profiled
    warmup, active = profile_steps_for(config, workload)
    # One arm at a time under the profiler; then every arm reads its events at once (seconds of Python each), since
    # nothing is measured any more.
    recorded = []
    for arm in [a for a in live() if a != "compile"]:
        trace = str(state.out_dir / f"trace-{workload}-{arm}.json.gz") if config.trace else None
        if call(processes, state, arm, Profile(workload, warmup, active, trace)) is not None:
            recorded.append(arm)
    summaries = overlapped(processes, state, {arm: SummarizeProfile(workload) for arm in recorded})
    for arm in recorded:
        result = summaries.get(arm)
        if result is None:
            continue
        state.profiles[(state.point, workload, arm)] = result["result"]
        state.correctness.append({
            "workload": workload, "arm": arm, "tensor": "-", "metric": "profile_complete",
            "value": float(not result["problems"]), "tolerance": 1.0, "passed": not result["problems"],
            "detail": "; ".join(result["problems"]) or "trace complete" + (
                "; patch kernels present" if arm in unit.candidate_arms() and unit.patch_of(arm).kernel_names else "")})
