"""Which worker processes a run starts, in which order: its arms, then the extra replicas of the compared ones.

Declared without torch, pandas or transformers, so the command line can start the processes (harness/prestart.py)
before the parent has imported any of them.
"""

from __future__ import annotations

from dataclasses import replace

from e2eprof import candidates as cand
from e2eprof.config import AA_ARM, CompareConfig
from e2eprof.harness.protocol import ArmSpec


def candidate_arm(config: CompareConfig) -> str:
    """The arm whose speedup over the baseline is judged: the patched model, or the second baseline in A/A."""
    return AA_ARM if config.aa else "patched"


def planned_arms(config: CompareConfig, attn: str) -> list[ArmSpec]:
    """baseline and patched (or baseline twice for A/A), then the stock reference arms asked for."""
    arms = [ArmSpec("baseline", attn, False)]
    if config.aa:
        return arms + [ArmSpec(AA_ARM, attn, False)]
    arms += [ArmSpec(name, attn, True) for name in cand.arm_names(config)]  # "patched", or one per candidate
    if "sdpa" in config.reference_arms and attn != "sdpa":
        arms.append(ArmSpec("sdpa", "sdpa", False))
    if "compile" in config.reference_arms:
        # The strongest stock path: the compiler over the stock model with its fastest attention.
        arms.append(ArmSpec("compile", "sdpa", False, compile=True))
    return arms


def with_replicas(config: CompareConfig, arms: list[ArmSpec]) -> list[ArmSpec]:
    """Every process to start: the arms, then the extra replicas of the baseline and the candidate (config.replicas
    processes each). Replicas come last and in reverse, so a round of timed blocks runs baseline, patched, ...,
    patched#1, baseline#1 and the next round the reverse: each arm's processes sit symmetric in time.
    Reference arms run once: their intervals against the candidate carry the process noise of one process.
    """
    compared = {"baseline", candidate_arm(config), *cand.arm_names(config)}
    extra = [replace(arm, replica=r) for r in range(1, config.replicas) for arm in arms if arm.name in compared]
    return arms + extra[::-1]
