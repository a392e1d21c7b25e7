"""One arm's raw latency samples: validation, a summary, and the array helpers the bootstraps share.

Latencies are positive and finite; NaN or inf means a broken timer upstream, so it raises instead of being dropped.
Percentiles use numpy's default linear interpolation (Hyndman-Fan type 7, as in R and pandas).
"""

from __future__ import annotations

import numpy as np


# Cap on elements per chunk of bootstrap indices (~32 MB of int64), so 10k-sample arms do not allocate gigabytes.
_MAX_CHUNK_ELEMENTS = 4_000_000


def _as_samples(x, name: str) -> np.ndarray:
    """1-D float64 copy of ``x``; raises on NaN/inf because a non-finite latency is a measurement bug, not data."""
    arr = np.asarray(x, dtype=np.float64).ravel()
    if not np.all(np.isfinite(arr)):
        bad = int(np.count_nonzero(~np.isfinite(arr)))
        raise ValueError(f"{name}: {bad} non-finite value(s) (NaN/inf); fix or filter them before computing statistics")
    return arr


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
