"""Replicas: the baseline and the candidate each run in several identical processes, so the offset each process
carries (process noise) averages out instead of setting a floor no amount of timing can pass."""

import math
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from e2eprof.analysis import stats
from e2eprof.harness.arm_process import ArmFailed
from e2eprof.config import AA_ARM, CompareConfig, DeviceDefaults
from e2eprof.errors import UsageError
from e2eprof.harness.pool import call, process_failed
from e2eprof.phases.timing import stop_reason
from e2eprof.harness.arm_plan import planned_arms, with_replicas
from e2eprof.analysis.summary import summarize
from e2eprof.analysis.verdict import FAIL
from e2eprof.harness.protocol import Block, arm_of

from tests.e2eprof.test_adaptive import State
from tests.e2eprof.test_summary import clean_checks, steps_for

OOM = "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def cpu_config(**changes):
    return CompareConfig(**({"model": "gpt2-tiny", "patch": "fastsoftmax", "device": "cpu"} | changes))


def test_each_arms_processes_average_their_offsets():
    assert stats.replicated_process_noise(0.0044) == 0.0044
    assert stats.replicated_process_noise(0.0044, 2, 2) == pytest.approx(0.0044 / math.sqrt(2))
    assert stats.replicated_process_noise(0.0044, 4, 4) == pytest.approx(0.0022)
    # A reference arm in one process against a candidate in two: s^2 (1 + 1/2), s^2 = noise^2 / 2.
    assert stats.replicated_process_noise(0.0044, 1, 2) == pytest.approx(0.0044 * math.sqrt(0.75))
    with pytest.raises(ValueError):
        stats.replicated_process_noise(0.0044, 0, 2)


def test_processes_are_counted_from_the_steps_replica_ids():
    """The one count the stop rule, the summary and `diff` share: distinct replica ids; none at all is one process."""
    assert stats.count_processes(pd.Series([0, 1, 0, 1])) == 2
    assert stats.count_processes(s["replica"] for s in [{"replica": 0}, {"replica": 2}, {"replica": 2}]) == 2
    assert stats.count_processes(pd.Series([0, None, 1], dtype="Int64")) == 2  # a missing id is not a process
    assert stats.count_processes(None) == stats.count_processes([]) == 1  # a run from before replicas
    assert stats.count_processes(pd.Series([np.nan, np.nan])) == 1


def test_defaults_by_device_and_bad_values():
    assert DeviceDefaults.for_device("cuda").replicas == 2 and DeviceDefaults.for_device("cpu").replicas == 1
    assert cpu_config().replicas == 1 and cpu_config(replicas=3).replicas == 3
    for bad in (0, -1, 9, 1.5, True):
        with pytest.raises(UsageError, match="--replicas"):
            cpu_config(replicas=bad)
    # A data-parallel arm is one torchrun group: it defaults to one, and more is refused rather than half-supported.
    assert cpu_config(workloads=("train-ddp",), nproc=2).replicas == 1
    with pytest.raises(UsageError, match="--replicas"):
        cpu_config(workloads=("train-ddp",), nproc=2, replicas=2)


def test_cli_rejects_zero_replicas_in_one_line():
    result = subprocess.run([sys.executable, "-m", "e2eprof", "compare", "--model", "gpt2-tiny", "--device", "cpu",
                             "--replicas", "0"], capture_output=True, text=True, timeout=120)
    lines = [line for line in result.stderr.strip().splitlines() if line]
    assert result.returncode == 2 and len(lines) == 1 and "--replicas" in lines[0], result.stderr


def test_only_the_compared_arms_are_replicated_and_sit_symmetric_in_a_round():
    config = cpu_config(replicas=3, reference_arms=("sdpa",))
    keys = [a.key for a in with_replicas(config, planned_arms(config, "eager"))]
    assert keys == ["baseline", "patched", "sdpa", "patched#2", "baseline#2", "patched#1", "baseline#1"]
    assert {arm_of(k) for k in keys} == {"baseline", "patched", "sdpa"}
    aa = cpu_config(replicas=2, aa=True)
    assert [a.key for a in with_replicas(aa, planned_arms(aa, "eager"))] == ["baseline", AA_ARM, f"{AA_ARM}#1", "baseline#1"]
    assert [a.key for a in with_replicas(cpu_config(), planned_arms(cpu_config(), "eager"))] == ["baseline", "patched", "sdpa"]


class Process:
    def __init__(self):
        self.closed = False

    def close(self):
        self.closed = True


def run_state():
    return SimpleNamespace(arm_failures={}, out_of_memory=set(), correctness=[], pending={})


def test_a_replica_out_of_memory_is_dropped_and_its_arm_goes_on():
    processes = {"baseline": Process(), "baseline#1": Process()}
    replica = processes["baseline#1"]
    state = run_state()
    process_failed(processes, state, "baseline#1", ArmFailed("baseline", "error", OOM), "cold", "train")
    assert "baseline#1" not in processes and replica.closed
    assert state.arm_failures == {} and state.out_of_memory == set()
    row = state.correctness[-1]
    assert (row["arm"], row["metric"], row["passed"], row["workload"]) == ("baseline", "replica_dropped", True, "train")
    # A round of blocks listed its processes before the drop: the dropped one is skipped, not a KeyError.
    assert call(processes, state, "baseline#1", Block("train", 0, 1)) is None


def test_any_other_failure_of_a_replica_fails_its_arm():
    processes = {"patched": Process(), "patched#1": Process()}
    state = run_state()
    process_failed(processes, state, "patched#1", ArmFailed("patched", "crash", "worker process exited with code -11"),
                    "block", "train")
    assert "patched" in state.arm_failures and state.correctness[-1]["metric"] == "arm_failed"
    # The arm's first process out of memory is the arm's, as without replicas: it sits the workload out.
    state = run_state()
    process_failed(processes, state, "patched", ArmFailed("patched", "error", OOM), "cold", "train")
    assert ("patched", "train") in state.out_of_memory and "patched" in processes


def replicated_steps(arm, median_ms, offsets, noise=0.002):
    """Steps of one arm from len(offsets) processes, each with its own relative offset."""
    rows = []
    for replica, offset in enumerate(offsets):
        rows += [r | {"replica": replica} for r in steps_for("train", arm, median_ms * (1 + offset), noise=noise,
                                                              seed=replica)]
    return rows


def test_the_summary_counts_each_arms_processes_and_folds_in_less_noise():
    config = cpu_config(workloads=("train",), reference_arms=(), process_noise=0.0044)
    checks = clean_checks("train", ["baseline", "patched"])
    one = steps_for("train", "baseline", 100, noise=0.002) + steps_for("train", "patched", 101, noise=0.002)
    two = replicated_steps("baseline", 100, [0.0, 0.0]) + replicated_steps("patched", 101, [0.0, 0.0])
    rows_one, verdicts_one = summarize(one, checks, config, set())
    rows_two, verdicts_two = summarize(two, checks, config, set())
    single = next(r for r in rows_one if r["arm"] == "patched")
    double = next(r for r in rows_two if r["arm"] == "patched")
    assert single["processes"] == 1 and double["processes"] == 2
    assert double["process_noise"] == pytest.approx(0.0044 / math.sqrt(2))
    assert double["ci_half_width"] < single["ci_half_width"]
    # 1% slower: inside the +-0.86% floor's reach with one process per arm, outside it with two.
    assert verdicts_two["train"].verdict == FAIL and verdicts_two["train"].reasons == ["SLOWER"]
    # The cold step shown is the arm's first process's, not a replica's.
    cold = [dict(r, replica=1, wall_ns=int(90e6)) for r in two if r["phase"] == "cold"]
    rows_cold, _ = summarize(two + cold, checks, config, set())
    assert next(r for r in rows_cold if r["arm"] == "baseline")["cold_ms"] == pytest.approx(50.0)


def test_the_stop_rule_uses_the_noise_of_the_processes_that_ran():
    def rows(replicas):
        out = []
        for arm in ("baseline", "patched"):
            for replica in range(replicas):
                out += [r | {"replica": replica} for r in steps_for("train", arm, 100, blocks=10, per_block=5,
                                                                       noise=0.001, seed=replica)]
        return out

    config = cpu_config(budget_seconds=60.0, process_noise=0.0055, target_half_width=0.01)
    # 0.55% alone gives +-1.08% with one process per arm: out of reach; with two per arm +-0.76%: reached.
    assert stop_reason(config, State(rows(1)), "train", blocks=10, elapsed=1.0) == "target below the process noise"
    assert stop_reason(config, State(rows(2)), "train", blocks=10, elapsed=1.0) == "target interval reached"


def test_self_benchmark_judges_aa_runs_at_the_default_process_count():
    from tests.test_self_benchmark import load_module

    sb = load_module()
    runs = pd.DataFrame({
        "speedup": [1.006, 0.995, 1.003, 1.0, 1.002], "ci_low": [1.003, 0.992, 1.0, 0.997, 0.999],
        "ci_high": [1.009, 0.998, 1.006, 1.003, 1.005], "mw_p_adjusted": [0.001] * 5, "process_noise": [0.0] * 5,
        "significant": [True, True, False, False, False], "verdict": ["FAIL", "FAIL", "PASS", "PASS", "PASS"],
        "processes": [1, 1, 2, 2, 2], "error": [""] * 5})
    text, meets, detail = sb.figure("aa", runs, default_noise=0.0044, default_replicas=2)
    assert text.startswith("0 of 3 A/A runs significant with 2 process(es) per arm") and meets == sb.UNRESOLVED
    assert detail[0].startswith("- **2 process(es) per arm**, 3 runs")
    assert any(line.startswith("- **1 process(es) per arm**, 2 runs") for line in detail)


# ---- process noise from the run's own processes --------------------------------------------------------------


@pytest.mark.parametrize("x, df, expected", [(7.3, 1, 0.006895461063618973), (7.3, 2, 0.02599112877875535),
                                             (7.3, 3, 0.06292623645904312), (20.0, 5, 0.0012497305630313773),
                                             (0.5, 4, 0.9735009788392561), (13.8, 2, 0.0010077854290485102)])
def test_chi2_survival_matches_scipy(x, df, expected):
    # expected: scipy.stats.chi2.sf(x, df), computed once (scipy is not a dependency)
    assert stats.chi2_sf(x, df) == pytest.approx(expected, rel=1e-10)


def simulated_processes(rng, offsets_sd, processes=4, steps=40, step_noise=0.01):
    """One arm's processes: each a lognormal offset of sd offsets_sd, steps of step_noise around it, blocks of 5."""
    runs = []
    for _ in range(processes):
        level = 100 * math.exp(rng.normal(0, offsets_sd))
        runs.append((level * np.exp(rng.normal(0, step_noise, steps)), np.repeat(np.arange(steps // 5), 5)))
    return runs


def test_the_runs_replicas_estimate_the_spread_between_processes():
    rng = np.random.default_rng(1)
    true_noise = 0.02 * math.sqrt(2)  # offsets of sd 2% per process: a ratio of two single processes moves by 2.8%
    estimates = [stats.process_spread({"baseline": simulated_processes(rng, 0.02),
                                       "patched": simulated_processes(rng, 0.02)}, floor=0.0, n_boot=200, seed=i)
                 for i in range(60)]
    assert all(e.df == 6 for e in estimates)
    # unbiased in variance: the mean of the squared estimates is the true variance, within the simulation's error
    assert np.mean([e.estimate ** 2 for e in estimates]) == pytest.approx(true_noise ** 2, rel=0.3)
    assert np.median([e.p_disagree for e in estimates]) < 1e-6  # 2% offsets against a 0 floor: they disagree


def test_processes_that_agree_are_rarely_flagged_and_one_process_per_arm_gives_no_estimate():
    rng = np.random.default_rng(2)
    flagged = [stats.process_spread({"baseline": simulated_processes(rng, 0.003, processes=2),
                                     "patched": simulated_processes(rng, 0.003, processes=2)},
                                    floor=0.0044, n_boot=200, seed=i).p_disagree < 0.05 for i in range(200)]
    assert np.mean(flagged) < 0.10  # offsets within the floor: flagged at about the test's 5% rate, no more
    alone = stats.process_spread({"baseline": simulated_processes(rng, 0.1, processes=1),
                                  "patched": simulated_processes(rng, 0.1, processes=1)}, floor=0.0044)
    assert alone.df == 0 and math.isnan(alone.estimate) and math.isnan(alone.p_disagree)


def test_disagreeing_replicas_get_no_speed_verdict_and_a_reason():
    """README's rmsnorm row (H200, llama-1b batch 4 infer): the patched processes' medians 33.1 and 38.3 ms, the
    baseline's 32.3 and 30.6 ms; with the device's 0.44% process noise it read FAIL (SLOWER) 0.911x."""
    config = cpu_config(workloads=("infer",), reference_arms=(), process_noise=0.0044)
    checks = clean_checks("infer", ["baseline", "patched"])

    def arm(name, medians):
        rows = []
        for replica, median in enumerate(medians):
            rows += [r | {"replica": replica} for r in steps_for("infer", name, median, noise=0.01, seed=replica)]
        return rows

    steps = arm("baseline", [32.3, 30.6]) + arm("patched", [33.1, 38.3])
    rows, verdicts = summarize(steps, checks, config, set())
    verdict = verdicts["infer"]
    assert verdict.verdict == "INCONCLUSIVE" and "REPLICAS_DISAGREE" in verdict.reasons, verdict
    assert "per-process medians baseline: 32.2" in verdict.advice and "patched: 33.0" in verdict.advice
    patched = next(r for r in rows if r["arm"] == "patched")
    assert patched["replicas_disagree_p"] < 1e-6 and patched["process_noise_df"] == 2
    assert patched["process_noise_estimate"] > 0.05  # what the run showed, not the 0.44% assumed
    assert patched["process_noise"] >= patched["process_noise_estimate"] / math.sqrt(2) * 0.999
    # Agreeing replicas with the same 1% steps: judged as before, on the floor.
    steps = arm("baseline", [32.3, 32.31]) + arm("patched", [36.0, 36.02])
    _, verdicts = summarize(steps, checks, config, set())
    assert verdicts["infer"].verdict == FAIL and verdicts["infer"].reasons == ["SLOWER"]


def test_a_correctness_failure_stands_whatever_the_timing():
    from e2eprof.analysis.verdict import Verdict, withhold_speed

    assert withhold_speed(Verdict("FAIL", ["INCORRECT", "SLOWER"]), "REPLICAS_DISAGREE", "x").verdict == "FAIL"
    assert withhold_speed(Verdict("FAIL", ["SLOWER", "THROTTLED"]), "REPLICAS_DISAGREE", "x").reasons == [
        "REPLICAS_DISAGREE", "THROTTLED"]
    assert withhold_speed(Verdict("PASS", ["FASTER"]), "JIT_DURING_TIMING", "x").verdict == "INCONCLUSIVE"
    assert withhold_speed(Verdict("FAIL", ["AA_FALSE_ALARM"]), "REPLICAS_DISAGREE", "x").verdict == "INCONCLUSIVE"
