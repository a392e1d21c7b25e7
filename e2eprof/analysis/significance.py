"""Rank tests and multiple-testing corrections: Mann-Whitney U, Holm and Benjamini-Hochberg adjusted p-values."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from e2eprof.analysis.samples import _as_samples


@dataclass(frozen=True)
class MWResult:
    """Mann-Whitney U test of ``a`` against ``b`` (normal approximation, tie and continuity corrected).

    ``u`` counts pairs with a_i > b_j (ties count 1/2), so ``u`` near 0 means ``a`` tends to be smaller.
    ``z`` is signed the same way (negative: ``a`` smaller). ``p_less`` tests "a tends to be smaller than b".
    """

    u: float
    z: float
    p_two_sided: float
    p_less: float
    p_greater: float


def _norm_cdf(z: float) -> float:
    """Standard normal CDF. erfc keeps full relative precision in the lower tail, where 1 - erf(...) would cancel."""
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def mann_whitney(a, b) -> MWResult:
    """Mann-Whitney U test, normal approximation with tie correction and continuity correction.

    U = R_a - n_a(n_a+1)/2 with average ranks for ties, i.e. the number of pairs with a_i > b_j plus half the ties.
    Under H0, E[U] = n_a n_b / 2 and Var[U] = n_a n_b / 12 * ((n+1) - sum(t^3 - t) / (n(n-1))) over tie groups t.
    The continuity correction moves U half a step towards E[U] (as scipy does), which keeps the normal
    approximation from overstating significance on small samples. This matches scipy's ``method="asymptotic"``;
    for tiny samples (n < ~8 per arm) exact p-values differ a little.

    Degenerate inputs (an empty arm, or every value identical so Var[U] = 0) carry no evidence: z = 0, all p = 1.
    """
    x = _as_samples(a, "a")
    y = _as_samples(b, "b")
    n1, n2 = x.size, y.size
    if n1 == 0 or n2 == 0:
        return MWResult(u=0.0, z=0.0, p_two_sided=1.0, p_less=1.0, p_greater=1.0)

    both = np.concatenate([x, y])
    _, inverse, counts = np.unique(both, return_inverse=True, return_counts=True)
    # Average 1-based rank of each distinct value: last position of its group minus half the group's extra width.
    avg_rank = np.cumsum(counts) - (counts - 1) / 2.0
    ranks = avg_rank[inverse]
    u = float(ranks[:n1].sum() - n1 * (n1 + 1) / 2.0)

    n = n1 + n2
    mu = n1 * n2 / 2.0
    tie_term = float(np.sum(counts.astype(np.float64) ** 3 - counts))
    var = n1 * n2 / 12.0 * ((n + 1) - tie_term / (n * (n - 1)))
    if var <= 0:  # all values identical
        return MWResult(u=u, z=0.0, p_two_sided=1.0, p_less=1.0, p_greater=1.0)
    sigma = math.sqrt(var)

    d = u - mu
    p_less = _norm_cdf((d + 0.5) / sigma)  # small U is evidence that a < b
    p_greater = _norm_cdf(-(d - 0.5) / sigma)
    z = math.copysign(max(abs(d) - 0.5, 0.0), d) / sigma
    # Two-sided with the correction applied towards the mean: 2 * min one-sided, capped because |d| < 0.5 gives > 1.
    p_two = min(1.0, 2.0 * min(p_less, p_greater))
    return MWResult(u=u, z=z, p_two_sided=p_two, p_less=min(1.0, p_less), p_greater=min(1.0, p_greater))


def _as_pvalues(pvalues) -> np.ndarray:
    p = np.asarray(pvalues, dtype=np.float64).ravel()
    if np.any(np.isnan(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError(f"p-values must lie in [0, 1] and not be NaN, got {p.tolist()}")
    return p


def holm(pvalues) -> list[float]:
    """Holm-Bonferroni step-down adjusted p-values, in the input order (controls the family-wise error rate).

    Sorted ascending, p_(i) (1-based i) is scaled by (m - i + 1); a running maximum keeps the adjusted values
    monotone (a smaller raw p never gets a larger adjusted p), and they are capped at 1.
    Reject hypothesis j at level alpha iff adjusted[j] <= alpha.
    """
    p = _as_pvalues(pvalues)
    m = p.size
    if m == 0:
        return []
    order = np.argsort(p, kind="stable")
    scaled = (m - np.arange(m)) * p[order]
    adj_sorted = np.minimum(1.0, np.maximum.accumulate(scaled))
    adj = np.empty(m)
    adj[order] = adj_sorted
    return adj.tolist()


def benjamini_hochberg(pvalues) -> list[float]:
    """Benjamini-Hochberg step-up adjusted p-values (q-values), in input order (controls the false discovery rate).

    Sorted ascending, p_(i) is scaled by m / i; a running minimum from the largest down makes them monotone, capped
    at 1. Use it for many per-op comparisons where a few false leads are tolerable; use ``holm`` for sign-off gates.
    """
    p = _as_pvalues(pvalues)
    m = p.size
    if m == 0:
        return []
    order = np.argsort(p, kind="stable")
    scaled = p[order] * m / np.arange(1, m + 1)
    adj_sorted = np.minimum(1.0, np.minimum.accumulate(scaled[::-1])[::-1])
    adj = np.empty(m)
    adj[order] = adj_sorted
    return adj.tolist()
