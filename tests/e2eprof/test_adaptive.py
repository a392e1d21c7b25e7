"""Adaptive length: timing stops once the interval is tight enough, out of reach, the budget is spent, or blocks run out."""

import types

import numpy as np

from e2eprof.config import CompareConfig
from e2eprof.phases.timing import stop_reason


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
    return CompareConfig(**({"model": "gpt2-tiny", "patch": "fastsoftmax", "device": "cpu", "budget_seconds": 60.0,
                             "process_noise": 0.0} | changes))


def test_tight_interval_stops_early():
    assert stop_reason(config(), State(steps(noise=0.001)), "train", blocks=10, elapsed=1.0) == "target interval reached"


def test_wide_interval_keeps_going_until_budget_or_block_limit():
    noisy = State(steps(noise=0.05))  # about +-2.3%: (2.3 / 1)^2 x 1 s is well inside two 60 s budgets
    assert stop_reason(config(), noisy, "train", blocks=10, elapsed=1.0) is None
    assert stop_reason(config(max_blocks=10), noisy, "train", blocks=10, elapsed=1.0) == "block limit reached"
    nearly = State(steps(noise=0.02))  # just wider than 1%: within reach, so only the budget stops it
    assert stop_reason(config(), nearly, "train", blocks=10, elapsed=30.0) is None
    assert stop_reason(config(), nearly, "train", blocks=10, elapsed=61.0) == "time budget spent"


def test_an_interval_the_budget_cannot_narrow_to_the_target_stops_early():
    # +-2.3% after 30 s would need ~160 s more at 1/sqrt(time); +-9% is hopeless at any point.
    assert stop_reason(config(), State(steps(noise=0.05)), "train", blocks=10, elapsed=10.0) is None
    assert stop_reason(config(), State(steps(noise=0.05)), "train", blocks=10, elapsed=30.0) == \
        "target out of reach within the budget"
    assert stop_reason(config(), State(steps(noise=0.2)), "train", blocks=10, elapsed=30.0) == \
        "target out of reach within the budget"


def test_stopping_reads_the_width_never_the_side_of_one():
    # The same noise with the candidate 10% slower or 10% faster: the same decision at every elapsed time.
    def shifted(factor):
        return State([dict(r, wall_ns=int(r["wall_ns"] * factor)) if r["arm"] == "patched" else r
                      for r in steps(noise=0.05)])
    for elapsed in (1.0, 10.0, 30.0, 61.0):
        reasons = {stop_reason(config(), shifted(f), "train", blocks=10, elapsed=elapsed) for f in (0.9, 1.0, 1.1)}
        assert len(reasons) == 1, (elapsed, reasons)


def test_zero_budget_means_fixed_steps():
    assert stop_reason(config(budget_seconds=0.0), State(steps(noise=0.2)), "train", blocks=10, elapsed=0.0) == "fixed steps"


def test_a_failed_arm_stops_timing():
    state = State(steps(noise=0.2))
    state.arm_failures = {"patched": "crashed"}
    assert stop_reason(config(), state, "train", blocks=10, elapsed=1.0) == "arm failed"


def test_an_arm_out_of_memory_stops_timing():
    state = State(steps(noise=0.2))
    state.out_of_memory = {("patched", "train")}
    assert stop_reason(config(), state, "train", blocks=10, elapsed=1.0) == "out of memory"


def test_rows_of_an_earlier_sweep_point_are_not_pooled():
    # A tight earlier point must not make a noisy current point look settled.
    earlier = [dict(r, point="b1-s64-bf16") for r in steps(noise=0.0001, blocks=40)]
    state = State(earlier + [dict(r, point="b8-s1024-bf16") for r in steps(noise=0.05)])
    assert stop_reason(config(), state, "train", blocks=10, elapsed=1.0) is None
