"""Adaptive length: timing stops once the interval is tight enough, the budget is spent, or blocks run out."""

import types

import numpy as np

from e2eprof.config import CompareConfig
from e2eprof.runner import _stop_reason


class State:
    """The parts of the runner's state the stopping rule reads."""

    def __init__(self, steps):
        self.steps = steps
        self.arm_failures = {}
        self.out_of_memory = set()
        self.point = types.SimpleNamespace(id="b8-s1024-bf16")


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


def test_an_arm_out_of_memory_stops_timing():
    state = State(steps(noise=0.2))
    state.out_of_memory = {("patched", "train")}
    assert _stop_reason(config(), state, "train", blocks=10, elapsed=1.0) == "out of memory"


def test_rows_of_an_earlier_sweep_point_are_not_pooled():
    # A tight earlier point must not make a noisy current point look settled.
    earlier = [dict(r, point="b1-s64-bf16") for r in steps(noise=0.0001, blocks=40)]
    state = State(earlier + [dict(r, point="b8-s1024-bf16") for r in steps(noise=0.2)])
    assert _stop_reason(config(), state, "train", blocks=10, elapsed=1.0) is None
