"""Statistics for A/B step-latency comparisons: summaries, a bootstrap interval on the ratio of medians,
Mann-Whitney U, multiple-testing corrections and the minimum detectable effect.

Pure functions on 1-D numpy arrays: no I/O, no torch, no scipy. Raw samples are stored elsewhere; everything here is
derived from them on demand, so a report can always be recomputed from its raw rows.

Conventions:
- Latencies are positive and finite. NaN or inf means a broken timer upstream, so it raises instead of being dropped.
- ``ratio = median(baseline) / median(candidate)``: above 1 means the candidate is FASTER (a speedup factor).
- Percentiles use numpy's default linear interpolation (Hyndman-Fan type 7, as in R and pandas).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import NormalDist

import numpy as np

# A block bootstrap can only vary as much as its blocks do: with B blocks there are at most C(2B-1, B) distinct
# resamples and the variance is biased low by (B-1)/B. Below this many paired blocks the interval would be falsely
# narrow (a false win), so we fall back to resampling samples independently, which is conservative under drift.
MIN_PAIRED_BLOCKS = 10

# Cap on elements per chunk of bootstrap indices (~32 MB of int64), so 10k-sample arms do not allocate gigabytes.
_MAX_CHUNK_ELEMENTS = 4_000_000


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


# ----------------------------------------------------------------------------------------------------------------
# helpers


def _as_samples(x, name: str) -> np.ndarray:
    """1-D float64 copy of ``x``; raises on NaN/inf because a non-finite latency is a measurement bug, not data."""
    arr = np.asarray(x, dtype=np.float64).ravel()
    if not np.all(np.isfinite(arr)):
        bad = int(np.count_nonzero(~np.isfinite(arr)))
        raise ValueError(f"{name}: {bad} non-finite value(s) (NaN/inf); fix or filter them before computing statistics")
    return arr


def _norm_cdf(z: float) -> float:
    """Standard normal CDF. erfc keeps full relative precision in the lower tail, where 1 - erf(...) would cancel."""
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def _row_medians(x: np.ndarray) -> np.ndarray:
    """Median of each row of a (n_boot, n) matrix; NaN entries are padding (blocks of unequal size) and are ignored.

    np.nanmedian falls back to a Python loop over rows for wide arrays, so the padded case sorts instead: NaN sorts
    last, and the median of the first ``c`` values of each row is the mean of positions (c-1)//2 and c//2.
    """
    nan = np.isnan(x)
    if not nan.any():
        return np.median(x, axis=1)
    s = np.sort(x, axis=1)
    c = x.shape[1] - nan.sum(axis=1)  # real samples per row; >= 1 because every block holds at least one sample
    lo = np.take_along_axis(s, ((c - 1) // 2)[:, None], axis=1)[:, 0]
    hi = np.take_along_axis(s, (c // 2)[:, None], axis=1)[:, 0]
    return 0.5 * (lo + hi)


def _chunks(n_boot: int, width: int):
    """Yield (start, stop) row ranges so each chunk of a (n_boot, width) index matrix stays under the memory cap."""
    rows = max(1, _MAX_CHUNK_ELEMENTS // max(1, width))
    for start in range(0, n_boot, rows):
        yield start, min(n_boot, start + rows)


def _block_matrix(x: np.ndarray, labels: np.ndarray, block_ids: np.ndarray) -> np.ndarray:
    """Pack samples into a (B, k_max) matrix, one row per block in ``block_ids`` order, NaN-padded to equal width."""
    rows = [x[labels == b] for b in block_ids]
    k_max = max(len(r) for r in rows)
    m = np.full((len(rows), k_max), np.nan)
    for i, r in enumerate(rows):
        m[i, : len(r)] = r
    return m


def _as_block_labels(labels, n: int, name: str) -> np.ndarray:
    arr = np.asarray(labels).ravel()
    if arr.shape[0] != n:
        raise ValueError(f"{name}: {arr.shape[0]} labels for {n} samples; need one block index per sample")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not (np.issubdtype(arr.dtype, np.floating) and np.all(arr == np.round(arr))):
            raise ValueError(f"{name}: block labels must be integers, got dtype {arr.dtype}")
        arr = arr.astype(np.int64)
    return arr


# ----------------------------------------------------------------------------------------------------------------
# public API


def describe(samples) -> dict:
    """Summary of one arm's samples: n, median, mean, p10, p90, iqr, cv, min, max.

    ``cv`` is the sample standard deviation (ddof=1) over the mean; it is NaN for n < 2, where spread is undefined.
    Empty input gives n=0 and NaN for everything else, so a report can show an arm that produced no samples.
    """
    x = _as_samples(samples, "samples")
    n = int(x.size)
    if n == 0:
        nan = float("nan")
        return {"n": 0, **{k: nan for k in ("median", "mean", "p10", "p90", "iqr", "cv", "min", "max")}}
    p10, p25, p50, p75, p90 = np.percentile(x, [10, 25, 50, 75, 90])
    mean = float(x.mean())
    cv = float(x.std(ddof=1) / mean) if n >= 2 and mean != 0 else float("nan")
    return {
        "n": n,
        "median": float(p50),
        "mean": mean,
        "p10": float(p10),
        "p90": float(p90),
        "iqr": float(p75 - p25),
        "cv": cv,
        "min": float(x.min()),
        "max": float(x.max()),
    }


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
    the bounds are lumpy and coverage is approximate. In simulation (lognormal noise, 400 runs each) coverage of a
    95% interval stayed at 94-97% from 10 to 200 samples per arm; paired blocks reached ~94% from 10 blocks on
    (78% at 3 blocks, 89% at 5, 92% at 8), hence ``MIN_PAIRED_BLOCKS``.

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


def with_process_noise(ci: RatioCI, process_noise: float) -> RatioCI:
    """The interval widened by what one pair of processes cannot show: the spread between identical processes.

    The bootstrap sees only the two processes that ran, so an offset belonging to a process (on the H200, host-side
    gaps between kernels that differ from one process to the next) looks like a real difference. ``process_noise``
    is the relative standard deviation of the log-ratio between two identical processes beyond their own interval,
    measured from A/A runs (benchmarks/self_benchmark.py --part aa prints it). Each side of the interval is widened
    in quadrature on the log scale, z * process_noise added to its distance from the ratio, so an asymmetric
    interval stays asymmetric and 0 returns the interval unchanged.
    """
    if not (math.isfinite(process_noise) and process_noise >= 0):
        raise ValueError(f"process_noise must be a finite fraction >= 0, got {process_noise}")
    if process_noise == 0 or not (ci.ratio > 0 and ci.low > 0 and ci.high > 0):
        return ci
    extra = process_noise_half_width(process_noise, ci.confidence)
    centre = math.log(ci.ratio)
    below, above = centre - math.log(ci.low), math.log(ci.high) - centre
    return replace(ci, low=math.exp(centre - math.hypot(below, extra)), high=math.exp(centre + math.hypot(above, extra)),
                   method=f"{ci.method}+process-noise", process_noise=process_noise)


def without_process_noise(ci: RatioCI) -> RatioCI:
    """The within-run interval with_process_noise started from (its exact inverse): what the bootstrap alone said."""
    if ci.process_noise == 0:
        return ci
    extra = process_noise_half_width(ci.process_noise, ci.confidence)
    centre = math.log(ci.ratio)
    below = math.sqrt(max((centre - math.log(ci.low)) ** 2 - extra ** 2, 0.0))
    above = math.sqrt(max((math.log(ci.high) - centre) ** 2 - extra ** 2, 0.0))
    return replace(ci, low=math.exp(centre - below), high=math.exp(centre + above),
                   method=ci.method.removesuffix("+process-noise"), process_noise=0.0)


def replicated_process_noise(process_noise: float, baseline_processes: int = 1, candidate_processes: int = 1) -> float:
    """The process noise of a ratio between arms that each ran in several identical processes (replicas).

    ``process_noise`` is defined for one process against one: Var(log ratio) = 2 * s^2 with s the spread of one
    process's offset. Each arm's location pools its processes, so their offsets average out:
    Var = s^2 * (1/n_b + 1/n_c) = process_noise^2 * (1/n_b + 1/n_c) / 2; two processes per arm give process_noise / sqrt(2).
    """
    return pooled_process_noise(process_noise, baseline_processes, process_noise, candidate_processes)


def pooled_process_noise(noise_a: float, processes_a: int, noise_b: float, processes_b: int) -> float:
    """replicated_process_noise where the two sides were judged with different process noises (e2eprof diff: one
    arm's B/A ratio across two runs, each with its own setting): Var = noise_a^2 / (2 n_a) + noise_b^2 / (2 n_b)."""
    if processes_a < 1 or processes_b < 1:
        raise ValueError(f"need at least one process per arm, got {processes_a} and {processes_b}")
    return math.sqrt((noise_a ** 2 / processes_a + noise_b ** 2 / processes_b) / 2)


def count_processes(replicas) -> int:
    """How many identical processes timed an arm: the distinct replica ids of its samples (a step's `replica`).
    Samples without one, from runs made before replicas, came from a single process."""
    if replicas is None:
        return 1
    ids = set()
    for replica in replicas:
        try:
            value = float(replica)
        except TypeError:  # None or pandas' NA: a step without an id
            continue
        if not math.isnan(value):
            ids.add(int(value))
    return max(len(ids), 1)


@dataclass(frozen=True)
class ProcessSpread:
    """What a run's own processes say about how far identical processes land apart (JMH's forks, pyperf's workers).

    estimate: the process noise the run's replicas imply, on process_noise's scale (relative SD of the log-ratio
        between two single processes): sqrt(2) times the spread of per-process log medians within each arm, less
        what their own steps explain. NaN when no arm ran in two processes or more.
    df: the degrees of freedom behind it (sum over arms of processes - 1).
    p_disagree: how likely replicas this far apart are if each process's offset had only the floor's spread and
        its median only its steps' noise (chi-square test); NaN without df. A small value means the replicas
        measured different things (a noisy neighbour, a process on a starved core) and no interval can be trusted.
    """

    estimate: float
    df: int
    p_disagree: float


def _log_median_variance(samples: np.ndarray, blocks: np.ndarray | None, n_boot: int, rng: np.random.Generator) -> float:
    """Bootstrap variance of one process's log median: its blocks resampled (its samples where blocks are few)."""
    if blocks is not None:
        ids = np.unique(blocks)
        if ids.size >= 3:
            m = _block_matrix(samples, blocks, ids)  # (B, k) NaN-padded
            draw = rng.integers(0, ids.size, size=(n_boot, ids.size))
            return float(np.var(np.log(_row_medians(m[draw].reshape(n_boot, -1))), ddof=1))
    idx = rng.integers(0, samples.size, size=(n_boot, samples.size))
    return float(np.var(np.log(np.median(samples[idx], axis=1)), ddof=1))


def process_spread(processes: dict[str, list[tuple[np.ndarray, np.ndarray | None]]], floor: float,
                   n_boot: int = 400, seed: int = 0) -> ProcessSpread:
    """ProcessSpread of arms that each ran in one or more processes.

    processes: arm -> one (samples, block labels or None) pair per process. floor: the device's process noise
    (process_noise's scale), the spread identical processes are known to have.
    """
    rng = np.random.default_rng(seed)
    squares, chi, df, within = 0.0, 0.0, 0, []
    floor_var = (floor / math.sqrt(2)) ** 2  # one process's offset variance
    for runs in processes.values():
        runs = [(_as_samples(x, "samples"), b) for x, b in runs if len(x) >= 2]
        if len(runs) < 2:
            continue
        logs = np.array([math.log(float(np.median(x))) for x, _ in runs])
        var = np.array([_log_median_variance(x, None if b is None else np.asarray(b), n_boot, rng) for x, b in runs])
        weights = 1.0 / (var + floor_var) if floor_var > 0 or np.all(var > 0) else np.ones_like(var)
        centre = float(np.sum(weights * logs) / np.sum(weights))
        chi += float(np.sum(weights * (logs - centre) ** 2))
        squares += float(np.sum((logs - logs.mean()) ** 2))
        within += var.tolist()
        df += len(runs) - 1
    if df == 0:
        return ProcessSpread(estimate=math.nan, df=0, p_disagree=math.nan)
    excess = squares / df - float(np.mean(within))
    estimate = math.sqrt(2 * excess) if excess > 0 else 0.0
    return ProcessSpread(estimate=estimate, df=df, p_disagree=chi2_sf(chi, df))


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X chi-square with integer df (closed forms: no scipy here)."""
    if x <= 0:
        return 1.0
    half = x / 2
    if df % 2 == 0:  # exp(-x/2) * sum_{k < df/2} (x/2)^k / k!
        term, total = 1.0, 1.0
        for k in range(1, df // 2):
            term *= half / k
            total += term
        return min(1.0, math.exp(-half) * total)
    # odd: erfc(sqrt(x/2)) + exp(-x/2) * sum_{k=1}^{(df-1)/2} (x/2)^(k-1/2) / Gamma(k+1/2)
    total, term = math.erfc(math.sqrt(half)), math.sqrt(half) / math.gamma(1.5)
    for k in range(1, (df - 1) // 2 + 1):
        if k > 1:
            term *= half / (k - 0.5)
        total += math.exp(-half) * term
    return min(1.0, total)


def process_noise_half_width(process_noise: float, confidence: float = 0.95) -> float:
    """The relative half-width process noise alone gives an interval: the narrowest any run with these processes
    per arm can reach, however long it times (pass replicated_process_noise for more than one per arm)."""
    return NormalDist().inv_cdf(0.5 + confidence / 2) * process_noise


def process_noise_estimate(ratios, lows, highs, confidence: float = 0.95) -> float:
    """The process noise that A/A runs imply: their log-ratios' spread beyond what their own intervals show.

    Var(log ratio across runs) = mean within-run variance (each interval's half-width / z, squared) + process
    noise squared; negative excess (intervals already wide enough) gives 0. Needs at least 3 runs.
    """
    r, lo, hi = (np.asarray(v, dtype=float) for v in (ratios, lows, highs))
    if r.size < 3:
        raise ValueError(f"need at least 3 A/A runs to estimate process noise, got {r.size}")
    within = ((np.log(hi) - np.log(lo)) / (2 * process_noise_half_width(1.0, confidence))) ** 2
    excess = float(np.var(np.log(r), ddof=1) - within.mean())
    return math.sqrt(excess) if excess > 0 else 0.0


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
