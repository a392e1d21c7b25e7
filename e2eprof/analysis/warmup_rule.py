"""When warm-up can end: two consecutive windows of steps at the same level, within a tolerance or the steps' noise."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np


# How many standard errors two warm-up windows' medians may differ by and still count as the same level (~95%).
WARMUP_Z = 2.0


def warmup_noise_bound(previous, current) -> float:
    """How far apart, relative to their level, two warm-up windows' medians land from the steps' noise alone.

    The noise is read from successive differences inside each window, so a trend across the windows (still
    warming up) does not pass for noise; a trend inside a window inflates it only by about a third of what the
    trend moves the next window's median. For steps of iid normal noise sigma, |x[i+1] - x[i]| has median
    0.6745 * sqrt(2) * sigma; a median of n steps has standard error sqrt(pi / 2) * sigma / sqrt(n).
    """
    diffs = [abs(b - a) for w in (previous, current) for a, b in zip(w, w[1:])]
    level = float(np.median(list(previous) + list(current)))
    if not diffs or not level > 0:
        return 0.0
    sigma = float(np.median(diffs)) / (NormalDist().inv_cdf(0.75) * math.sqrt(2))
    se_median = math.sqrt(math.pi / 2) * sigma / math.sqrt(len(current))
    return WARMUP_Z * math.sqrt(2) * se_median / level


def warm_windows_agree(previous, current, tolerance: float) -> bool:
    """Whether warm-up can end: two consecutive windows' medians within `tolerance` of each other, or within what
    the steps' own noise explains.

    Steady steps (a GPU-bound train step, +-0.3%) are held to `tolerance`. Host-bound decoding swings by +-30%, so
    two windows of 5 rarely agree within 2% and its processes warmed up to the cap (reports/README.md, "Cost";
    tests/e2eprof/test_warmup.py replays those steps). A difference the noise explains cannot be told from warming
    up, and the interleaved timed blocks spread any slow drift left over evenly across the arms.
    """
    drift = abs(float(np.median(current)) / float(np.median(previous)) - 1)
    return drift < max(tolerance, warmup_noise_bound(previous, current))
