"""Adaptive length: timing stops once the interval is tight enough, the budget is spent, or blocks run out."""

import numpy as np

from e2eprof.config import CompareConfig
from e2eprof.runner import _stop_reason


class State:
    def __init__(self, steps):
        self.steps = steps
        self.arm_failures = {}


def steps(noise, blocks=10, per_block=5, seed=0):
    rng = np.random.default_rng(seed)
    return [{"workload": "train", "arm": arm, "block": b, "phase": "warm",
             "wall_ns": int(100e6 * (1 + noise * rng.standard_normal()))}
            for b in range(blocks) for arm in ("baseline", "patched") for _ in range(per_block)]


def config(**changes):
    return CompareConfig(**({"model": "gpt2-tiny", "patch": "fastsoftmax", "device": "cpu", "budget_seconds": 60.0} | changes))


def test_tight_interval_stops_early():
    assert _stop_reason(config(), State(steps(noise=0.001)), "train", blocks=10, elapsed=1.0) == "target interval reached"


def test_wide_interval_keeps_going_until_budget_or_block_limit():
    noisy = State(steps(noise=0.2))
    assert _stop_reason(config(), noisy, "train", blocks=10, elapsed=1.0) is None
    assert _stop_reason(config(), noisy, "train", blocks=10, elapsed=61.0) == "time budget spent"
    assert _stop_reason(config(max_blocks=10), noisy, "train", blocks=10, elapsed=1.0) == "block limit reached"


def test_zero_budget_means_fixed_steps():
    assert _stop_reason(config(budget_seconds=0.0), State(steps(noise=0.2)), "train", blocks=10, elapsed=0.0) == "fixed steps"


def test_a_failed_arm_stops_timing():
    state = State(steps(noise=0.2))
    state.arm_failures = {"patched": "crashed"}
    assert _stop_reason(config(), state, "train", blocks=10, elapsed=1.0) == "arm failed"
