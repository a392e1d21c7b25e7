"""A bootstrap interval on the ratio of medians of two arms, and what its width says (half-width, detectable effect).

``ratio = median(baseline) / median(candidate)``: above 1 means the candidate is FASTER (a speedup factor).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from e2eprof.analysis.samples import _as_block_labels, _as_samples, _block_matrix, _chunks, _row_medians


# A block bootstrap can only vary as much as its blocks do: with B blocks there are at most C(2B-1, B) distinct
# resamples and the variance is biased low by (B-1)/B. Below this many paired blocks the interval would be falsely
# narrow (a false win), so we fall back to resampling samples independently, which is conservative under drift.
MIN_PAIRED_BLOCKS = 10


@dataclass(frozen=True)
class RatioCI:
    """Bootstrap confidence interval on ``median(baseline) / median(candidate)`` (> 1: candidate faster).

    ``method`` is one of ``"percentile/paired-blocks"``, ``"percentile/independent"`` or
    ``"percentile/independent:too-few-blocks"`` (blocks were given but fewer than ``MIN_PAIRED_BLOCKS`` were paired).
    """

    ratio: float
    low: float
    high: float
    confidence: float
    n_boot: int
    method: str
    process_noise: float = 0.0  # the between-process spread folded in by with_process_noise (0: within-run only)


def ratio_of_medians_ci(
    baseline,
    candidate,
    *,
    baseline_blocks=None,
    candidate_blocks=None,
    confidence: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> RatioCI:
    """Percentile-bootstrap confidence interval on ``median(baseline) / median(candidate)``.

    Each bootstrap replicate resamples BOTH arms, so the interval carries both arms' variance.

    - Without block labels, each arm is resampled independently, sample by sample.
    - With block labels (an integer block index per sample; block i of each arm ran close in time, as in ABBA
      interleaving), whole blocks are resampled and the SAME drawn block ids are used for both arms. Slow drift
      (clocks, heat) then moves both arms' replicate medians together and cancels in the ratio, instead of
      widening the interval. Both arms must have the same set of block ids. With fewer than ``MIN_PAIRED_BLOCKS``
      blocks the block bootstrap cannot see enough variation, so the samples are resampled independently instead
      (method ``"percentile/independent:too-few-blocks"``).

    Why percentile and not BCa: BCa's acceleration comes from a jackknife, and the jackknife is inconsistent for
    the median (a non-smooth statistic), so the "correction" would add noise. The percentile interval is invariant
    to monotone transforms (the same interval on ratio or log-ratio), and in simulation (tests/e2eprof/test_stats.py)
    it covers the true ratio at close to the nominal rate for 100 samples per arm.

    Caveat: a bootstrapped median can only take sample values, so with few samples or a coarse timer (many ties)
    the bounds are lumpy and coverage is approximate. In simulation coverage stays near nominal from 10 samples per
    arm, while paired blocks fall short below about 10 blocks, hence ``MIN_PAIRED_BLOCKS``.

    Raises ValueError for arms with fewer than 2 samples (a 1-sample arm would give a zero-width interval, i.e. a
    false certainty), non-positive or non-finite samples, or too few replicates for the requested confidence.
    """
    x = _as_samples(baseline, "baseline")
    y = _as_samples(candidate, "candidate")
    if x.size < 2 or y.size < 2:
        raise ValueError(f"need at least 2 samples per arm, got baseline={x.size}, candidate={y.size}")
    if np.any(x <= 0) or np.any(y <= 0):
        raise ValueError("latencies must be positive for a ratio of medians")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    alpha = 1.0 - confidence
    # Each tail quantile must rest on at least one replicate, else the bound is just the sample extreme.
    if n_boot * alpha / 2 < 1:
        raise ValueError(f"n_boot={n_boot} too small for confidence={confidence}; need >= {math.ceil(2 / alpha)}")
    if (baseline_blocks is None) != (candidate_blocks is None):
        raise ValueError("give block labels for both arms or for neither")

    ratio = float(np.median(x) / np.median(y))
    rng = np.random.default_rng(seed)

    method = "percentile/independent"
    boot = None
    if baseline_blocks is not None:
        bx = _as_block_labels(baseline_blocks, x.size, "baseline_blocks")
        by = _as_block_labels(candidate_blocks, y.size, "candidate_blocks")
        ids_x, ids_y = np.unique(bx), np.unique(by)
        if not np.array_equal(ids_x, ids_y):
            only_x = np.setdiff1d(ids_x, ids_y).tolist()
            only_y = np.setdiff1d(ids_y, ids_x).tolist()
            raise ValueError(
                f"block ids differ between arms (only in baseline: {only_x[:10]}, only in candidate: {only_y[:10]}); "
                "blocks must pair one to one"
            )
        if ids_x.size >= MIN_PAIRED_BLOCKS:
            boot = _paired_block_bootstrap(x, bx, y, by, ids_x, n_boot, rng)
            method = "percentile/paired-blocks"
        else:
            method = "percentile/independent:too-few-blocks"
    if boot is None:
        boot = _independent_bootstrap(x, y, n_boot, rng)

    low, high = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    return RatioCI(ratio=ratio, low=float(low), high=float(high), confidence=confidence, n_boot=n_boot, method=method)


def _independent_bootstrap(x: np.ndarray, y: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(n_boot,) replicate ratios, each arm resampled with replacement on its own."""
    med_x = np.empty(n_boot)
    med_y = np.empty(n_boot)
    for arr, out in ((x, med_x), (y, med_y)):
        for a, b in _chunks(n_boot, arr.size):
            idx = rng.integers(0, arr.size, size=(b - a, arr.size))  # (rows, n)
            out[a:b] = np.median(arr[idx], axis=1)
    return med_x / med_y


def _paired_block_bootstrap(x, bx, y, by, block_ids, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(n_boot,) replicate ratios; one draw of block ids per replicate is shared by both arms."""
    mx = _block_matrix(x, bx, block_ids)  # (B, kx) NaN-padded
    my = _block_matrix(y, by, block_ids)  # (B, ky)
    n_blocks = block_ids.size
    out = np.empty(n_boot)
    width = n_blocks * max(mx.shape[1], my.shape[1])
    for a, b in _chunks(n_boot, width):
        draw = rng.integers(0, n_blocks, size=(b - a, n_blocks))  # (rows, B): same blocks for both arms
        med_x = _row_medians(mx[draw].reshape(b - a, -1))  # (rows, B, kx) -> (rows, B*kx)
        med_y = _row_medians(my[draw].reshape(b - a, -1))
        out[a:b] = med_x / med_y
    return out


def ci_halfwidth_rel(ci: RatioCI) -> float:
    """Half the interval's width relative to its ratio, e.g. 0.01 for 1.05 [1.04, 1.06] (about +-1%).

    The adaptive stopping rule watches this: sampling can stop once it is below the declared target.
    """
    if not ci.ratio > 0:  # also catches NaN
        return float("nan")
    return (ci.high - ci.low) / 2.0 / ci.ratio


def minimum_detectable_effect(ci: RatioCI) -> float:
    """Smallest relative speedup (or slowdown) this run could resolve: the interval's relative half-width.

    A true ratio of 1 + e produces an interval of about this width around 1 + e, which excludes 1 only when e is
    larger than the half-width. So 0.02 means "effects under ~2% are invisible in this run", and a "no
    difference" verdict only rules out effects larger than that (at roughly 50% power: detecting an effect
    of exactly this size reliably takes a somewhat narrower interval).
    """
    return ci_halfwidth_rel(ci)
