"""Process noise: what separates two identical processes, folded into every interval so A/A runs stay quiet."""

import math
import subprocess
import sys

import numpy as np
import pytest

from e2eprof.analysis import stats
from e2eprof.config import AA_ARM, DeviceDefaults, CompareConfig
from e2eprof.errors import UsageError
from e2eprof.phases.timing import stop_reason
from e2eprof.analysis.summary import summarize
from e2eprof.analysis.verdict import FAIL, INCONCLUSIVE, PASS

from tests.e2eprof.test_adaptive import State, steps as adaptive_steps
from tests.e2eprof.test_summary import clean_checks, steps_for

Z95 = 1.959963984540054


def test_zero_noise_leaves_the_interval_alone():
    ci = stats.RatioCI(1.02, 1.01, 1.04, 0.95, 2000, "percentile/independent")
    assert stats.with_process_noise(ci, 0.0) == ci


def test_each_side_grows_in_quadrature_on_the_log_scale():
    ci = stats.RatioCI(1.0, math.exp(-0.003), math.exp(0.005), 0.95, 2000, "percentile/independent")
    wide = stats.with_process_noise(ci, 0.004)
    extra = Z95 * 0.004
    assert math.log(wide.low) == pytest.approx(-math.hypot(0.003, extra))
    assert math.log(wide.high) == pytest.approx(math.hypot(0.005, extra))
    assert wide.ratio == ci.ratio and wide.process_noise == 0.004 and wide.method.endswith("+process-noise")
    back = stats.without_process_noise(wide)
    assert (back.low, back.high) == (pytest.approx(ci.low), pytest.approx(ci.high)) and back.method == ci.method


@pytest.mark.parametrize("bad", [-0.001, math.nan, math.inf])
def test_a_negative_or_non_finite_noise_is_refused(bad):
    ci = stats.RatioCI(1.0, 0.99, 1.01, 0.95, 2000, "x")
    with pytest.raises(ValueError):
        stats.with_process_noise(ci, bad)


def simulated_aa(n_runs, process_sd, within_sd, seed=0):
    """A/A ratios whose runs each carry a process offset (sd process_sd) plus a within-run error (sd within_sd),
    with the intervals the within-run error alone would give."""
    rng = np.random.default_rng(seed)
    log_r = process_sd * rng.standard_normal(n_runs) + within_sd * rng.standard_normal(n_runs)
    return np.exp(log_r), np.exp(log_r - Z95 * within_sd), np.exp(log_r + Z95 * within_sd)


def test_the_estimate_recovers_the_process_noise_of_simulated_runs():
    ratios, lows, highs = simulated_aa(4000, process_sd=0.004, within_sd=0.0016)
    assert stats.process_noise_estimate(ratios, lows, highs) == pytest.approx(0.004, rel=0.05)
    quiet = simulated_aa(4000, process_sd=0.0, within_sd=0.0016)
    assert stats.process_noise_estimate(*quiet) < 0.0006  # intervals already explain the spread
    with pytest.raises(ValueError):
        stats.process_noise_estimate([1.0, 1.0], [0.99, 0.99], [1.01, 1.01])


def test_widened_intervals_keep_their_coverage_where_within_run_ones_lose_it():
    ratios, lows, highs = simulated_aa(4000, process_sd=0.004, within_sd=0.0016, seed=1)
    raw_false_alarms = np.mean((lows > 1) | (highs < 1))
    wide = [stats.with_process_noise(stats.RatioCI(r, lo, hi, 0.95, 0, "sim"), 0.004) for r, lo, hi in zip(ratios, lows, highs)]
    false_alarms = np.mean([w.low > 1 or w.high < 1 for w in wide])
    assert raw_false_alarms > 0.3  # what the A/A runs on the H200 showed: 4 of 11
    assert 0.03 < false_alarms < 0.07


def aa_rows(offset, process_noise):
    steps = steps_for("train", "baseline", 100, noise=0.002) + steps_for("train", AA_ARM, 100 * (1 + offset), noise=0.002)
    config = CompareConfig(model="gpt2-tiny", patch="fastsoftmax", device="cpu", workloads=("train",), aa=True,
                           process_noise=process_noise)
    return summarize(steps, clean_checks("train", ["baseline", AA_ARM], candidate=AA_ARM), config, set())


def test_an_aa_offset_inside_the_process_noise_is_no_false_alarm():
    # 0.6% between identical processes: what one H200 A/A run showed (0.992x), called significant without the noise.
    _, bare = aa_rows(0.006, 0.0)
    assert bare["train"].verdict == FAIL and bare["train"].reasons[0] == "AA_FALSE_ALARM"
    rows, widened = aa_rows(0.006, 0.0044)
    assert widened["train"].verdict == PASS and widened["train"].reasons[0] == "NO_SIGNIFICANT_DIFFERENCE"
    candidate = next(r for r in rows if r["arm"] == AA_ARM)
    assert candidate["process_noise"] == 0.0044 and candidate["ci_low"] < 1 < candidate["ci_high"]
    _, far = aa_rows(0.03, 0.0044)  # 3% is no process noise: still flagged
    assert far["train"].verdict == FAIL and far["train"].reasons[0] == "AA_FALSE_ALARM"


def test_the_gpu_defaults_give_decode_a_floor_of_its_own():
    gpu = DeviceDefaults.for_device("cuda")
    assert gpu.noise_floor("train") == gpu.process_noise == 0.0044
    assert gpu.noise_floor("decode") == 0.0067  # from decode's own A/A runs, above the device's
    assert DeviceDefaults.for_device("cpu").noise_floor("decode") == DeviceDefaults.for_device("cpu").process_noise


def test_a_workload_floor_widens_that_workload_only_and_a_given_noise_replaces_every_floor():
    def run(**options):
        steps = [s for w in ("train", "decode") for s in
                 steps_for(w, "baseline", 100, noise=0.002) + steps_for(w, AA_ARM, 100.9, noise=0.002)]
        checks = clean_checks("train", ["baseline", AA_ARM], candidate=AA_ARM) + clean_checks(
            "decode", ["baseline", AA_ARM], candidate=AA_ARM)
        config = CompareConfig(model="gpt2-tiny", patch="fastsoftmax", device="cpu", workloads=("train", "decode"),
                               aa=True, **options)
        rows, verdicts = summarize(steps, checks, config, set())
        noise = {r["workload"]: r["process_noise"] for r in rows if r["arm"] == AA_ARM}
        return config, noise, verdicts

    config, noise, verdicts = run(process_noise=0.0044, workload_process_noise=(("decode", 0.0067),))
    assert noise == {"train": 0.0044, "decode": 0.0067}
    assert verdicts["train"].reasons[0] == "AA_FALSE_ALARM"  # 0.9% beyond train's floor
    assert verdicts["decode"].reasons[0] == "NO_SIGNIFICANT_DIFFERENCE"  # inside decode's
    config, noise, _ = run(process_noise=0.0044)  # the user's --process-noise is every workload's
    assert config.workload_process_noise == () and noise == {"train": 0.0044, "decode": 0.0044}
    again = CompareConfig.from_record(
        {**config.to_record(), "workload_process_noise": [["decode", 0.0067]]})
    assert again.workload_process_noise == (("decode", 0.0067),) and again.noise_floor("decode") == 0.0067


def test_a_real_slowdown_beyond_the_noise_still_fails():
    steps = steps_for("train", "baseline", 100, noise=0.002) + steps_for("train", "patched", 102, noise=0.002)
    config = CompareConfig(model="gpt2-tiny", patch="fastsoftmax", device="cpu", workloads=("train",),
                           reference_arms=(), process_noise=0.0044)
    _, verdicts = summarize(steps, clean_checks("train", ["baseline", "patched"]), config, set())
    assert verdicts["train"].verdict == FAIL and verdicts["train"].reasons == ["SLOWER"]


def test_a_difference_inside_the_noise_gets_advice_that_more_steps_cannot_help():
    steps = steps_for("train", "baseline", 100, noise=0.002) + steps_for("train", "patched", 100.3, noise=0.002)
    config = CompareConfig(model="gpt2-tiny", patch="fastsoftmax", device="cpu", workloads=("train",),
                           reference_arms=(), process_noise=0.006, target_half_width=0.01)
    _, verdicts = summarize(steps, clean_checks("train", ["baseline", "patched"]), config, set())
    assert verdicts["train"].verdict == INCONCLUSIVE
    assert "more steps cannot resolve it" in verdicts["train"].advice


def stop_config(**changes):
    return CompareConfig(**({"model": "gpt2-tiny", "patch": "fastsoftmax", "device": "cpu", "budget_seconds": 60.0}
                            | changes))


def test_stopping_counts_the_noise_and_gives_up_on_a_target_inside_it():
    tight = State(adaptive_steps(noise=0.001))
    assert stop_reason(stop_config(process_noise=0.0), tight, "train", blocks=10, elapsed=1.0) == "target interval reached"
    # 0.6% noise alone gives +-1.2%: a 1% target can never be reached, so timing stops at once and says why.
    assert stop_reason(stop_config(process_noise=0.006), tight, "train", blocks=10, elapsed=1.0) == \
        "target below the process noise"
    # 0.45% gives +-0.88%: reachable, but only once the within-run part is under ~0.47%.
    assert stop_reason(stop_config(process_noise=0.0045), tight, "train", blocks=10, elapsed=1.0) == "target interval reached"
    middling = State(adaptive_steps(noise=0.012))
    assert stop_reason(stop_config(process_noise=0.0), middling, "train", blocks=10, elapsed=1.0) == "target interval reached"
    assert stop_reason(stop_config(process_noise=0.0045), middling, "train", blocks=10, elapsed=1.0) is None


def test_defaults_by_device_and_a_bad_value_is_a_usage_error():
    assert DeviceDefaults.for_device("cuda").process_noise == pytest.approx(0.0044)
    assert CompareConfig(model="gpt2-tiny", patch="fastsoftmax", device="cpu").process_noise == \
        DeviceDefaults.for_device("cpu").process_noise
    for bad in (-0.01, 0.5, math.nan):
        with pytest.raises(UsageError, match="--process-noise"):
            CompareConfig(model="gpt2-tiny", patch="fastsoftmax", device="cpu", process_noise=bad)


def test_cli_rejects_a_negative_noise_in_one_line():
    result = subprocess.run([sys.executable, "-m", "e2eprof", "calibrate", "--model", "gpt2-tiny", "--device", "cpu",
                             "--process-noise", "-0.1"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = [line for line in result.stderr.strip().splitlines() if line]
    assert len(lines) == 1 and "--process-noise" in lines[0] and "Traceback" not in result.stderr
