"""Known-answer and simulation tests for e2eprof.analysis.stats.

Simulations are seeded so every run sees the same numbers; the tolerances are wide enough that a correct
implementation passes for any seed, and narrow enough that a falsely narrow (or falsely wide) interval fails.
"""

import math
import time

import numpy as np
import pytest

from e2eprof.analysis import stats
from e2eprof.analysis.stats import (
    MIN_PAIRED_BLOCKS,
    RatioCI,
    benjamini_hochberg,
    ci_halfwidth_rel,
    describe,
    holm,
    mann_whitney,
    minimum_detectable_effect,
    ratio_of_medians_ci,
)


def lognormal_arm(rng, n, median, cv):
    """n latencies with the given median and ~cv spread (for small cv, lognormal sigma ~= cv)."""
    return median * rng.lognormal(0.0, cv, n)


def abba_drift(n_blocks, per_block, drift):
    """Multiplicative drift factors for two interleaved arms: block i holds per_block steps of each arm, baseline
    first in even blocks and candidate first in odd ones (ABBA), under a linear slowdown of `drift` over the run."""
    t = np.arange(n_blocks * 2 * per_block).reshape(n_blocks, 2, per_block)  # (B, arm slot, step) -> time index
    first = np.arange(n_blocks) % 2  # 0: baseline runs first in this block
    t_base = t[np.arange(n_blocks), first].ravel()
    t_cand = t[np.arange(n_blocks), 1 - first].ravel()
    total = t.size
    labels = np.repeat(np.arange(n_blocks), per_block)
    return 1 + drift * t_base / total, 1 + drift * t_cand / total, labels


# ------------------------------------------------------------------------------------------------ describe


def test_describe_known_array():
    d = describe(np.arange(1, 11, dtype=float))  # 1..10
    # Linear interpolation (type 7): position q*(n-1) -> p10 at 0.9 -> 1.9, p90 -> 9.1, p25 3.25, p75 7.75.
    assert d["n"] == 10
    assert d["median"] == pytest.approx(5.5)
    assert d["mean"] == pytest.approx(5.5)
    assert d["p10"] == pytest.approx(1.9)
    assert d["p90"] == pytest.approx(9.1)
    assert d["iqr"] == pytest.approx(4.5)
    # Sample variance of 1..n is n(n+1)/12 = 110/12, so cv = sqrt(9.1667)/5.5 = 0.550482.
    assert d["cv"] == pytest.approx(math.sqrt(110 / 12) / 5.5)
    assert (d["min"], d["max"]) == (1.0, 10.0)


def test_describe_empty_gives_nans():
    d = describe([])
    assert d["n"] == 0
    assert set(d) == {"n", "median", "mean", "p10", "p90", "iqr", "cv", "min", "max"}
    assert all(math.isnan(v) for k, v in d.items() if k != "n")


def test_describe_single_sample_has_no_spread():
    d = describe([3.0])
    assert d["n"] == 1 and d["median"] == 3.0 and d["iqr"] == 0.0
    assert math.isnan(d["cv"])  # one sample says nothing about spread


def test_describe_rejects_nan():
    with pytest.raises(ValueError, match="non-finite"):
        describe([1.0, float("nan")])


# ------------------------------------------------------------------------------------------------ ratio CI


def test_aa_identical_distributions_no_difference():
    rng = np.random.default_rng(11)
    a = lognormal_arm(rng, 100, 10.0, 0.02)
    b = lognormal_arm(rng, 100, 10.0, 0.02)
    ci = ratio_of_medians_ci(a, b)
    assert ci.low < 1.0 < ci.high
    assert ci.method == "percentile/independent"
    assert (ci.confidence, ci.n_boot) == (0.95, 2000)
    assert mann_whitney(a, b).p_two_sided > 0.2


def test_same_array_twice_gives_ratio_one():
    a = lognormal_arm(np.random.default_rng(0), 50, 10.0, 0.02)
    ci = ratio_of_medians_ci(a, a.copy())
    assert ci.ratio == 1.0 and ci.low <= 1.0 <= ci.high


def test_five_percent_speedup_is_detected():
    rng = np.random.default_rng(5)
    base = lognormal_arm(rng, 100, 10.5, 0.02)
    cand = lognormal_arm(rng, 100, 10.0, 0.02)
    ci = ratio_of_medians_ci(base, cand)
    assert ci.low > 1.0  # interval excludes 1: a real win
    assert ci.ratio == pytest.approx(1.05, abs=0.01)
    assert ci.low <= 1.05 <= ci.high
    mw = mann_whitney(cand, base)
    assert mw.p_less < 1e-10 and mw.p_two_sided < 1e-10


def test_five_percent_regression_is_detected():
    rng = np.random.default_rng(6)
    base = lognormal_arm(rng, 100, 10.0, 0.02)
    cand = lognormal_arm(rng, 100, 10.5, 0.02)
    ci = ratio_of_medians_ci(base, cand)
    assert ci.high < 1.0
    assert ci.ratio == pytest.approx(1 / 1.05, abs=0.01)


@pytest.mark.parametrize(
    "true_ratio, n_base, n_cand, cv",
    [(1.0, 100, 100, 0.02), (1 / 1.05, 40, 150, 0.05)],  # A/A; a 5% regression with unequal, noisier arms
)
def test_interval_coverage_independent(true_ratio, n_base, n_cand, cv):
    # 200 simulated A/B runs; a correct 95% interval covers the true ratio ~190 times. Too narrow means false
    # wins (and at true_ratio=1 the miss rate IS the A/A false-positive rate); too wide means missed effects.
    rng = np.random.default_rng(1234)
    covered = 0
    for rep in range(200):
        base = lognormal_arm(rng, n_base, 10.0 * true_ratio, cv)
        cand = lognormal_arm(rng, n_cand, 10.0, cv)
        ci = ratio_of_medians_ci(base, cand, n_boot=1000, seed=rep)
        covered += ci.low <= true_ratio <= ci.high
    assert 0.88 <= covered / 200 <= 0.99


def test_interval_coverage_paired_blocks_under_drift():
    # Block pairing must not buy its narrower interval by undercovering: same check under a 5% drift, 20 blocks.
    rng = np.random.default_rng(99)
    drift_b, drift_c, labels = abba_drift(20, 5, 0.05)
    covered = 0
    for rep in range(200):
        base = lognormal_arm(rng, 100, 10.3, 0.02) * drift_b
        cand = lognormal_arm(rng, 100, 10.0, 0.02) * drift_c
        ci = ratio_of_medians_ci(base, cand, baseline_blocks=labels, candidate_blocks=labels, n_boot=1000, seed=rep)
        covered += ci.low <= 1.03 <= ci.high
    assert ci.method == "percentile/paired-blocks"
    assert 0.88 <= covered / 200 <= 1.0  # drift makes the pooled-median ratio itself noisier, so over-coverage is OK


def test_block_pairing_cancels_shared_drift():
    # A 20% slowdown over the run, shared by both arms, interleaved ABBA in 20 blocks, on 1% noise: without pairing
    # the drift looks like noise and widens the interval; pairing block i with block i cancels most of it.
    for seed in range(5):
        rng = np.random.default_rng(seed)
        drift_b, drift_c, labels = abba_drift(20, 10, 0.20)
        base = lognormal_arm(rng, 200, 10.3, 0.01) * drift_b
        cand = lognormal_arm(rng, 200, 10.0, 0.01) * drift_c
        paired = ratio_of_medians_ci(base, cand, baseline_blocks=labels, candidate_blocks=labels)
        unpaired = ratio_of_medians_ci(base, cand)
        assert paired.method == "percentile/paired-blocks"
        assert paired.ratio == unpaired.ratio  # the point estimate does not depend on the resampling scheme
        assert ci_halfwidth_rel(paired) < 0.85 * ci_halfwidth_rel(unpaired)
        assert paired.low <= 1.03 <= paired.high


def test_unequal_block_sizes():
    # Blocks of different sizes take the NaN-padded path; result must stay sane and bracket the true ratio.
    rng = np.random.default_rng(3)
    sizes_b = rng.integers(3, 12, 15)
    sizes_c = rng.integers(3, 12, 15)
    lb = np.repeat(np.arange(15), sizes_b)
    lc = np.repeat(np.arange(15), sizes_c)
    base = lognormal_arm(rng, lb.size, 10.4, 0.02)
    cand = lognormal_arm(rng, lc.size, 10.0, 0.02)
    ci = ratio_of_medians_ci(base, cand, baseline_blocks=lb, candidate_blocks=lc)
    assert ci.method == "percentile/paired-blocks"
    assert ci.low < ci.ratio < ci.high and ci.low <= 1.04 <= ci.high


def test_row_medians_with_padding_matches_nanmedian():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 17))
    x[rng.random(x.shape) < 0.3] = np.nan
    x[:, 0] = rng.normal(size=50)  # every row keeps at least one real value, as every block has one sample
    np.testing.assert_allclose(stats._row_medians(x), np.nanmedian(x, axis=1))


def test_too_few_blocks_falls_back_to_independent():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(MIN_PAIRED_BLOCKS - 1), 10)
    base = lognormal_arm(rng, labels.size, 10.0, 0.02)
    cand = lognormal_arm(rng, labels.size, 10.0, 0.02)
    ci = ratio_of_medians_ci(base, cand, baseline_blocks=labels, candidate_blocks=labels)
    assert ci.method == "percentile/independent:too-few-blocks"
    plain = ratio_of_medians_ci(base, cand)  # same seed: the fallback is exactly the independent bootstrap
    assert (ci.ratio, ci.low, ci.high) == (plain.ratio, plain.low, plain.high)


def test_seeded_and_deterministic():
    rng = np.random.default_rng(0)
    a, b = lognormal_arm(rng, 80, 10.0, 0.02), lognormal_arm(rng, 80, 10.0, 0.02)
    assert ratio_of_medians_ci(a, b, seed=7) == ratio_of_medians_ci(a, b, seed=7)
    assert ratio_of_medians_ci(a, b, seed=7).low != ratio_of_medians_ci(a, b, seed=8).low


def test_result_is_frozen():
    ci = RatioCI(1.0, 0.9, 1.1, 0.95, 2000, "percentile/independent")
    with pytest.raises(AttributeError):
        ci.ratio = 2.0


@pytest.mark.parametrize("blocks", [False, True])
def test_bootstrap_is_fast(blocks):
    rng = np.random.default_rng(0)
    a, b = lognormal_arm(rng, 200, 10.0, 0.02), lognormal_arm(rng, 200, 10.0, 0.02)
    kw = {"baseline_blocks": np.repeat(np.arange(20), 10), "candidate_blocks": np.repeat(np.arange(20), 10)}
    t0 = time.perf_counter()
    ratio_of_medians_ci(a, b, n_boot=2000, **(kw if blocks else {}))
    assert time.perf_counter() - t0 < 1.0  # typically ~30 ms


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"baseline": [1.0], "candidate": [1.0, 2.0]}, "at least 2 samples"),
        ({"baseline": [], "candidate": []}, "at least 2 samples"),
        ({"baseline": [1.0, 0.0], "candidate": [1.0, 2.0]}, "positive"),
        ({"baseline": [1.0, np.nan], "candidate": [1.0, 2.0]}, "non-finite"),
        ({"baseline": [1.0, 2.0], "candidate": [1.0, 2.0], "confidence": 1.0}, "confidence"),
        ({"baseline": [1.0, 2.0], "candidate": [1.0, 2.0], "n_boot": 30}, "n_boot"),
        ({"baseline": [1.0, 2.0], "candidate": [1.0, 2.0], "baseline_blocks": [0, 1]}, "both arms"),
        (
            {"baseline": [1.0, 2.0], "candidate": [1.0, 2.0], "baseline_blocks": [0, 1], "candidate_blocks": [0]},
            "labels for 2 samples",
        ),
        (
            {"baseline": [1.0, 2.0], "candidate": [1.0, 2.0], "baseline_blocks": [0, 1], "candidate_blocks": [0, 2]},
            "block ids differ",
        ),
        (
            {"baseline": [1.0, 2.0], "candidate": [1.0, 2.0], "baseline_blocks": [0.5, 1], "candidate_blocks": [0, 1]},
            "integers",
        ),
    ],
)
def test_ratio_ci_rejects_bad_input(kwargs, match):
    kwargs = dict(kwargs)
    with pytest.raises(ValueError, match=match):
        ratio_of_medians_ci(kwargs.pop("baseline"), kwargs.pop("candidate"), **kwargs)


def test_constant_arms_give_zero_width_interval():
    ci = ratio_of_medians_ci([2.0] * 10, [1.0] * 10)
    assert (ci.ratio, ci.low, ci.high) == (2.0, 2.0, 2.0)


# ------------------------------------------------------------------------------------------------ Mann-Whitney


def test_mann_whitney_complete_separation():
    # a=[1,2,3], b=[4,5,6]: no a beats any b, U = 0. n1=n2=3, E[U] = 4.5, Var[U] = 3*3*7/12 = 5.25, sd = 2.29129.
    # Continuity-corrected z = (0 - 4.5 + 0.5)/2.29129 = -1.74574; Phi(-1.74574) = 0.040428 (normal table:
    # Phi(1.74) = 0.95907, Phi(1.75) = 0.95994, interpolated 0.95957). Two-sided = 2 * 0.040428 = 0.080856.
    r = mann_whitney([1, 2, 3], [4, 5, 6])
    assert r.u == 0.0
    assert r.z == pytest.approx(-1.745743, rel=1e-5)
    assert r.p_less == pytest.approx(0.040428, rel=1e-4)
    assert r.p_two_sided == pytest.approx(0.080856, rel=1e-4)
    # p_greater uses U corrected the other way: z = (0 - 4.5 - 0.5)/2.29129 = -2.18218, 1 - Phi(-2.18218) = 0.985452.
    assert r.p_greater == pytest.approx(0.985452, rel=1e-5)


def test_mann_whitney_with_ties():
    # a=[1,2,2,3], b=[2,3,4,5]. Pooled ranks: 1->1, the three 2s share ranks 2,3,4 -> 3, the two 3s share 5,6 -> 5.5,
    # 4->7, 5->8. R_a = 1+3+3+5.5 = 12.5, U = 12.5 - 4*5/2 = 2.5 (pair count: a=2 ties b=2 twice = 1, a=3 beats 2 and
    # ties 3 = 1.5). Ties: t=3 and t=2, sum(t^3 - t) = 24 + 6 = 30. Var[U] = 16/12 * (9 - 30/56) = 11.285714,
    # sd = 3.359422. z = (2.5 - 8 + 0.5)/3.359422 = -1.488351, Phi(-1.488351) = 0.068329.
    r = mann_whitney([1, 2, 2, 3], [2, 3, 4, 5])
    assert r.u == 2.5
    assert r.z == pytest.approx(-1.488351, rel=1e-5)
    assert r.p_less == pytest.approx(0.068329, rel=1e-4)
    assert r.p_two_sided == pytest.approx(2 * 0.068329, rel=1e-4)


def test_mann_whitney_is_antisymmetric():
    rng = np.random.default_rng(2)
    a, b = rng.normal(0, 1, 30), rng.normal(0.5, 1, 40)
    ab, ba = mann_whitney(a, b), mann_whitney(b, a)
    assert ab.u + ba.u == 30 * 40
    assert ab.z == pytest.approx(-ba.z)
    assert ab.p_less == pytest.approx(ba.p_greater)
    assert ab.p_two_sided == pytest.approx(ba.p_two_sided)


def test_mann_whitney_calibrated_under_null():
    # Under H0 about 5% of two-sided p-values fall below 0.05; 400 seeded draws, binomial sd ~1.1%.
    rng = np.random.default_rng(42)
    ps = [mann_whitney(rng.lognormal(0, 0.02, 50), rng.lognormal(0, 0.02, 50)).p_two_sided for _ in range(400)]
    assert 0.02 <= np.mean(np.array(ps) < 0.05) <= 0.08


@pytest.mark.parametrize(
    "a, b", [([], [1.0, 2.0]), ([1.0], []), ([], []), ([3.0, 3.0], [3.0, 3.0, 3.0]), ([1.0], [1.0])]
)
def test_mann_whitney_degenerate(a, b):
    r = mann_whitney(a, b)
    assert (r.p_two_sided, r.p_less, r.p_greater, r.z) == (1.0, 1.0, 1.0, 0.0)


def test_mann_whitney_p_values_capped_at_one():
    r = mann_whitney([1.0, 2.0], [1.0, 2.0])  # U exactly at its mean: corrected z would give p > 1
    assert r.p_two_sided == 1.0 and r.p_less <= 1.0 and r.p_greater <= 1.0


# ------------------------------------------------------------------------------------------------ multiple testing

# Benjamini & Hochberg (1995), section 4.1: 15 p-values from a myocardial-infarction study. At 0.05 the paper reports
# that the Bonferroni-type step-down (Holm) rejects 3 hypotheses and the FDR procedure rejects 4.
BH1995 = [0.0001, 0.0004, 0.0019, 0.0095, 0.0201, 0.0278, 0.0298, 0.0344, 0.0459, 0.3240, 0.4262, 0.5719, 0.6528,
          0.7590, 1.000]


def test_holm_textbook():
    adj = holm(BH1995)
    assert sum(p <= 0.05 for p in adj) == 3
    # By hand: 15*0.0001, 14*0.0004, 13*0.0019, 12*0.0095, 11*0.0201, 10*0.0278; then 9*0.0298 = 0.2682 is lifted
    # to the running max 0.278 (monotone), 8*0.0344 = 0.2752 -> 0.278, 7*0.0459 = 0.3213, 6*0.324 = 1.944 -> 1.
    expected = [0.0015, 0.0056, 0.0247, 0.114, 0.2211, 0.278, 0.278, 0.278, 0.3213] + [1.0] * 6
    assert adj == pytest.approx(expected)


def test_benjamini_hochberg_textbook():
    adj = benjamini_hochberg(BH1995)
    assert sum(p <= 0.05 for p in adj) == 4
    # By hand, p_(i)*15/i: 0.0015, 0.003, 0.0095, 0.035625, 0.0603, 0.0695 (-> 0.063857, the min over later ranks:
    # 0.0298*15/7), 0.063857, 0.0645, 0.0765, 0.486, 0.581182, 0.714875, 0.753231, 0.813214, 1.
    expected = [0.0015, 0.003, 0.0095, 0.035625, 0.0603, 0.0298 * 15 / 7, 0.0298 * 15 / 7, 0.0645, 0.0765, 0.486,
                0.4262 * 15 / 11, 0.5719 * 15 / 12, 0.6528 * 15 / 13, 0.7590 * 15 / 14, 1.0]
    assert adj == pytest.approx(expected)


def test_adjustments_keep_input_order():
    # Small hand example, shuffled: sorted 0.005, 0.01, 0.03, 0.04.
    # Holm: 4*0.005=0.02, 3*0.01=0.03, 2*0.03=0.06, 1*0.04=0.04 -> running max 0.06.
    # BH: 0.005*4/1=0.02, 0.01*4/2=0.02, 0.03*4/3=0.04, 0.04*4/4=0.04.
    p = [0.01, 0.04, 0.03, 0.005]
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert benjamini_hochberg(p) == pytest.approx([0.02, 0.04, 0.04, 0.02])


def test_adjustments_edge_cases():
    assert holm([]) == [] and benjamini_hochberg([]) == []
    assert holm([0.3]) == [0.3] and benjamini_hochberg([0.3]) == [0.3]
    assert holm([0.6, 0.7]) == [1.0, 1.0]  # capped
    with pytest.raises(ValueError):
        holm([0.1, float("nan")])
    with pytest.raises(ValueError):
        benjamini_hochberg([1.2])


def test_adjustments_are_monotone():
    p = np.random.default_rng(0).random(50)
    order = np.argsort(p)
    for adj in (holm(p), benjamini_hochberg(p)):
        a = np.asarray(adj)[order]
        # p * m / m may round a hair below p, hence the relative slack.
        assert np.all(np.diff(a) >= 0) and np.all(a >= p[order] * (1 - 1e-12)) and np.all(a <= 1)


# ------------------------------------------------------------------------------------------------ MDE


def test_halfwidth_and_mde():
    ci = RatioCI(ratio=1.05, low=1.04, high=1.061, confidence=0.95, n_boot=2000, method="percentile/independent")
    assert ci_halfwidth_rel(ci) == pytest.approx(0.0105 / 1.05)
    assert minimum_detectable_effect(ci) == pytest.approx(0.01)
    nan_ci = RatioCI(float("nan"), float("nan"), float("nan"), 0.95, 2000, "percentile/independent")
    assert math.isnan(minimum_detectable_effect(nan_ci))


def test_mde_shrinks_with_more_samples():
    rng = np.random.default_rng(0)
    small = ratio_of_medians_ci(lognormal_arm(rng, 50, 10, 0.02), lognormal_arm(rng, 50, 10, 0.02))
    large = ratio_of_medians_ci(lognormal_arm(rng, 800, 10, 0.02), lognormal_arm(rng, 800, 10, 0.02))
    assert minimum_detectable_effect(large) < 0.6 * minimum_detectable_effect(small)  # ~1/sqrt(16) = 0.25 expected
