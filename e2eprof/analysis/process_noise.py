"""Process noise: how far identical processes land apart, beyond what one run's own interval shows.

A run's bootstrap sees only the processes that ran, so each process's own offset looks like a real difference.
These functions widen an interval by that spread, pool it over replicas, and estimate it from A/A runs or replicas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import NormalDist

import numpy as np

from e2eprof.analysis.bootstrap import RatioCI
from e2eprof.analysis.samples import _as_samples, _block_matrix, _row_medians


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
