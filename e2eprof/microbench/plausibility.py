"""The bandwidth floor: an op cannot move its bytes faster than a plain copy of the same device moves bytes.

A replacement that seems to beat the copy roofline has not found a shortcut past physics: it skipped work
(computed part of the output, read a cached answer), or the byte count it is judged by is wrong. Either way its
time is no win, so such a row is flagged and fails (GUIDE section 3, "plausibility flags").

Noise is taken out in the op's favour on both sides: the op's bandwidth from its slow trials (p90 time), the
ceiling from the copy's fast trials (p10 time), and a margin on top. An op whose bytes fit in a cache is not judged:
it may run from the cache at more than the memory bandwidth the copy roofline measures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MARGIN = 0.05  # bandwidth share of the copy ceiling tolerated above 1 (clock and placement jitter between the two)


@dataclass(frozen=True)
class Plausibility:
    plausible: bool | None  # None: not timed, or not judged (fits in a cache)
    share: float  # bandwidth at the op's p90 time over the copy's p10 bandwidth
    reason: str


def judge_bandwidth(nbytes: float, slow_us: float, copy_ceiling_gbs: float, cache_bytes: int,
                    margin: float = MARGIN) -> Plausibility:
    """Is an op that moves at least `nbytes` in `slow_us` (its p90 time) within the copy ceiling (GB/s)?"""
    if not (math.isfinite(nbytes) and math.isfinite(slow_us) and slow_us > 0 and copy_ceiling_gbs > 0):
        return Plausibility(None, math.nan, "not timed")
    share = nbytes / slow_us / 1e3 / copy_ceiling_gbs  # bytes per microsecond / 1e3 = GB/s
    if nbytes < cache_bytes:
        return Plausibility(None, share, f"not judged: {_mb(nbytes)} fit in a {_mb(cache_bytes)} cache, "
                                         f"where the copy roofline is no ceiling")
    if share > 1 + margin:
        return Plausibility(False, share, f"faster than the bandwidth floor: even at its p90 time it moves {_mb(nbytes)} "
                                          f"at {share:.0%} of the fastest copy (limit {1 + margin:.0%}); it skips work "
                                          f"or its byte count is wrong")
    return Plausibility(True, share, f"p90 bandwidth {share:.0%} of the fastest copy")


def _mb(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f} MiB"
