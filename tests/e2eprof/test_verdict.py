"""The sign-off rules, one case per rule, and how verdicts combine."""

import pytest

from e2eprof.analysis import verdict as v
from e2eprof.analysis.verdict import EXIT_CODES, FAIL, INCONCLUSIVE, MIN_SAMPLES, PASS, decide, worst

# A clean, correct, well-sampled run that is 5% faster with a tight interval: PASS. Each case changes one thing.
GOOD = dict(correct=True, kernel_ran=True, baseline_clean=True, arm_failed=False, n_baseline=20, n_patched=20,
            ratio=1.05, ci_low=1.04, ci_high=1.06, min_speedup=0.01)


def decide_with(**changes):
    return decide(**(GOOD | changes))


def test_pass():
    result = decide_with()
    assert result.verdict == PASS and result.reasons == [v.FASTER]
    assert result.text == "PASS (FASTER)"


@pytest.mark.parametrize(
    "changes, reason",
    [
        ({"correct": False}, v.INCORRECT),
        ({"kernel_ran": False}, v.KERNEL_NOT_RUN),
        ({"baseline_clean": False}, v.BASELINE_CONTAMINATED),
        ({"arm_failed": True}, v.ARM_FAILED),
        ({"ratio": 0.9, "ci_low": 0.88, "ci_high": 0.92}, v.SLOWER),
    ],
)
def test_each_fail_reason(changes, reason):
    result = decide_with(**changes)
    assert result.verdict == FAIL
    assert result.reasons == [reason]


def test_fail_reasons_accumulate_and_beat_speed():
    result = decide_with(correct=False, kernel_ran=False, arm_failed=True, ci_low=1.5, ci_high=1.6)
    assert result.verdict == FAIL
    assert result.reasons == [v.ARM_FAILED, v.INCORRECT, v.KERNEL_NOT_RUN]


def test_fast_but_incorrect_is_fail_not_pass():
    assert decide_with(correct=False, ci_low=2.0, ci_high=2.1).verdict == FAIL


def test_below_margin():
    result = decide_with(ratio=1.008, ci_low=1.005, ci_high=1.011, min_speedup=0.01)
    assert result.verdict == INCONCLUSIVE and result.reasons == [v.BELOW_MARGIN]
    assert "1.0050" in result.advice and "1+0.01" in result.advice


def test_margin_boundary_is_not_a_pass():
    assert decide_with(ci_low=1.01, min_speedup=0.01).reasons == [v.BELOW_MARGIN]
    assert decide_with(ci_low=1.0101, min_speedup=0.01).verdict == PASS


def test_no_significant_difference():
    result = decide_with(ratio=1.0, ci_low=0.97, ci_high=1.03)
    assert result.verdict == INCONCLUSIVE and result.reasons == [v.NO_SIGNIFICANT_DIFFERENCE]
    assert "3.0%" in result.advice and "--steps" in result.advice


def test_interval_touching_one_from_below_is_not_slower():
    assert decide_with(ratio=0.98, ci_low=0.96, ci_high=1.0).reasons == [v.NO_SIGNIFICANT_DIFFERENCE]


@pytest.mark.parametrize("n_baseline, n_patched", [(MIN_SAMPLES - 1, 20), (20, MIN_SAMPLES - 1), (2, 2)])
def test_too_few_samples(n_baseline, n_patched):
    result = decide_with(n_baseline=n_baseline, n_patched=n_patched)  # looks fast, but too few steps to say
    assert result.verdict == INCONCLUSIVE and result.reasons == [v.TOO_FEW_SAMPLES]
    assert "--steps" in result.advice


def test_too_few_samples_cannot_claim_slower():
    result = decide_with(n_baseline=3, n_patched=3, ratio=0.5, ci_low=0.4, ci_high=0.6)
    assert result.reasons == [v.TOO_FEW_SAMPLES]


def test_too_few_samples_still_fails_on_correctness():
    assert decide_with(n_baseline=3, correct=False).reasons == [v.INCORRECT]


def test_exactly_min_samples_is_enough():
    assert decide_with(n_baseline=MIN_SAMPLES, n_patched=MIN_SAMPLES).verdict == PASS


@pytest.mark.parametrize(
    "verdicts, expected",
    [
        ([PASS, PASS], PASS),
        ([PASS, INCONCLUSIVE], INCONCLUSIVE),
        ([INCONCLUSIVE, PASS, FAIL], FAIL),
        ([FAIL, INCONCLUSIVE], FAIL),
        ([], INCONCLUSIVE),
    ],
)
def test_worst(verdicts, expected):
    assert worst(verdicts) == expected


def test_exit_codes():
    assert EXIT_CODES == {PASS: 0, FAIL: 1, INCONCLUSIVE: 3}


# ---- multiple comparisons and A/A -------------------------------------------------------------------------

def test_significant_interval_but_adjusted_p_above_alpha_is_inconclusive():
    # The interval says faster, but once every workload of the run is counted the rank test no longer does.
    result = decide_with(p_adjusted=0.2, alpha=0.05)
    assert result.verdict == INCONCLUSIVE and result.reasons == [v.NOT_SIGNIFICANT_AFTER_CORRECTION]
    slower = decide_with(ratio=0.9, ci_low=0.88, ci_high=0.92, p_adjusted=0.2, alpha=0.05)
    assert slower.verdict == INCONCLUSIVE and v.SLOWER not in slower.reasons


def test_adjusted_p_below_alpha_keeps_the_verdict():
    assert decide_with(p_adjusted=0.001, alpha=0.05).verdict == PASS
    assert decide_with(ratio=0.9, ci_low=0.88, ci_high=0.92, p_adjusted=0.001).reasons == [v.SLOWER]


AA_GOOD = dict(correct=True, arm_failed=False, n_baseline=20, n_patched=20, ratio=1.001, ci_low=0.996,
               ci_high=1.006, min_speedup=0.01)


def test_aa_identical_arms_pass_and_state_the_noise_floor():
    result = v.decide_aa(**AA_GOOD)
    assert result.verdict == PASS and result.reasons == [v.NO_SIGNIFICANT_DIFFERENCE]
    assert "noise floor +-0.50%" in result.advice


@pytest.mark.parametrize("ci", [(1.01, 1.02), (0.97, 0.99)])
def test_aa_difference_between_identical_arms_is_a_false_alarm(ci):
    result = v.decide_aa(**(AA_GOOD | {"ci_low": ci[0], "ci_high": ci[1], "ratio": sum(ci) / 2, "p_adjusted": 0.001}))
    assert result.verdict == FAIL and result.reasons[0] == v.AA_FALSE_ALARM


def test_aa_interval_off_one_but_not_significant_after_correction_passes():
    result = v.decide_aa(**(AA_GOOD | {"ci_low": 1.001, "ci_high": 1.02, "ratio": 1.01, "p_adjusted": 0.3}))
    assert result.verdict == PASS


def test_aa_too_noisy_to_have_seen_a_difference_is_inconclusive():
    result = v.decide_aa(**(AA_GOOD | {"ci_low": 0.8, "ci_high": 1.25, "ratio": 1.0}))
    assert result.verdict == INCONCLUSIVE and "wider than the 1% target" in result.advice


def test_aa_too_few_samples_and_failures():
    assert v.decide_aa(**(AA_GOOD | {"n_patched": 2})).reasons == [v.TOO_FEW_SAMPLES]
    assert v.decide_aa(**(AA_GOOD | {"arm_failed": True})).verdict == FAIL
    assert v.INCORRECT in v.decide_aa(**(AA_GOOD | {"correct": False})).reasons


def test_no_difference_says_how_many_more_steps_would_settle_it():
    result = decide_with(ratio=1.0, ci_low=0.97, ci_high=1.03, target_half_width=0.01)
    assert result.reasons == [v.NO_SIGNIFICANT_DIFFERENCE]
    assert "about 9x as many timed steps" in result.advice  # (0.03 / 0.01) ** 2
