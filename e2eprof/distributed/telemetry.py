"""NVML telemetry per rank: one sampler per rank's GPU (found by UUID), each sample and step joined within its rank.

Rank r of a group on this node runs on cuda:r (LOCAL_RANK), and the parent sees the same devices (same
CUDA_VISIBLE_DEVICES), so the parent's sampler for cuda:r reads rank r's GPU. A single-process run has one sampler,
rank 0. Same interface as telemetry.TelemetrySampler, so the runner uses either.
"""

from __future__ import annotations

import pandas as pd

from e2eprof.trackers import telemetry


class RankSamplers:
    """TelemetrySampler's interface over one sampler per rank; frames carry a `rank` column."""

    def __init__(self, samplers: list[telemetry.TelemetrySampler]):
        self.samplers = samplers

    @property
    def available(self) -> bool:
        return all(s.available for s in self.samplers)

    @property
    def unavailable_reason(self) -> str | None:
        reasons = [f"rank {r}: {s.unavailable_reason}" if len(self.samplers) > 1 else s.unavailable_reason
                   for r, s in enumerate(self.samplers) if not s.available]
        return "; ".join(reasons) or None

    def start(self) -> RankSamplers:
        for sampler in self.samplers:
            sampler.start()
        return self

    def stop(self) -> None:
        for sampler in self.samplers:
            sampler.stop()

    def frame(self) -> pd.DataFrame:
        return pd.concat([s.frame().assign(rank=r) for r, s in enumerate(self.samplers)], ignore_index=True)

    def info(self) -> dict:
        if len(self.samplers) == 1:
            return self.samplers[0].info() | {"rank": 0}
        return {"ranks": [s.info() | {"rank": r} for r, s in enumerate(self.samplers)]}


def open_rank_samplers(device: str, nproc: int) -> RankSamplers:
    """Samplers for `device` (one process) or for cuda:0..nproc-1 (a data-parallel run on this node's GPUs)."""
    if nproc == 1 or not device.startswith("cuda"):
        return RankSamplers([telemetry.open_sampler(device)])
    return RankSamplers([telemetry.open_sampler(f"cuda:{r}") for r in range(nproc)])


def per_rank(fn, steps: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """fn(steps, samples) within each rank (a rank's steps ran on its GPU alone), concatenated with `rank`."""
    step_ranks = steps["rank"] if "rank" in steps else pd.Series(0, index=steps.index)
    parts = []
    for rank in sorted(step_ranks.unique()):
        mine = samples[samples["rank"] == rank] if "rank" in samples else samples
        if len(mine):
            parts.append(fn(steps[step_ranks == rank], mine.drop(columns=["rank"], errors="ignore")).assign(rank=rank))
    return pd.concat(parts, ignore_index=True) if parts else steps
