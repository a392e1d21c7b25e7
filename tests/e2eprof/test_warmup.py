"""When warm-up ends: two windows' medians within the tolerance, or within what the steps' own noise explains.

The step sequences below are the warm-up steps (ms) of the default compare on the H200, 2026-12-03 12:25 UTC
(the cost run of `reports/self-benchmark-h200/cost.md`, its steps.parquet's phase "warmup"), replayed through the worker's
real warm-up loop: the H200's decoding cannot run here, its measured step times can.
"""

from __future__ import annotations

import numpy as np
import pytest

from types import SimpleNamespace

from e2eprof.harness.isolation import Placement
from e2eprof.analysis.stats import warm_windows_agree, warmup_noise_bound
from e2eprof.harness.worker import ArmWorker

TRAIN_BASELINE = [92.2, 93.1, 92.8, 92.7, 92.8, 94.0, 92.9, 93.2, 93.8, 93.1]
INFER_COMPILE = [7.4, 7.0, 6.9, 6.8, 6.8, 6.7, 6.7, 6.7, 6.7, 6.7, 6.7, 7.0, 6.7, 6.7, 6.7]
GENERATE_PATCHED = [345.7, 366.4, 343.9, 344.1, 344.9, 336.3, 289.3, 277.8, 292.4, 271.7, 297.5, 329.0, 295.4, 329.9,
                    345.5, 278.0, 271.2, 310.8, 335.9, 359.4, 339.8, 329.6, 319.3, 302.9, 332.2, 348.8, 347.0, 373.2,
                    371.5, 372.7, 343.6, 316.4, 259.9, 270.1, 256.8, 254.7, 263.1, 273.7, 250.0, 247.5, 252.4, 247.9,
                    250.5, 253.3, 247.4]
GENERATE_BASELINE = [173.5, 184.1, 236.7, 219.6, 213.7, 182.3, 171.6, 155.2, 166.0, 166.6, 165.5, 173.3, 153.7, 201.9,
                     182.2, 180.0, 214.4, 229.5, 172.3, 162.2, 161.4, 170.3, 168.5, 162.8, 164.7, 181.5, 180.7, 162.6,
                     164.4, 172.9, 173.6, 169.2, 159.7, 154.8, 155.0, 166.0, 158.1, 160.6, 156.1, 159.1]


def replayed_warmup(steps_ms: list[float], window: int = 5, tolerance: float = 0.02, max_steps: int = 50) -> int:
    """How many steps ArmWorker.warmup runs when its steps take steps_ms (the GPU default's window, tolerance, cap)."""
    worker = ArmWorker.__new__(ArmWorker)  # no model: only the loop's stopping decisions are under test
    worker.setup = SimpleNamespace(placement=Placement())
    replay = iter(steps_ms)
    worker._timed_step = lambda workload, phase, block: {"wall_ns": int(next(replay) * 1e6), "phase": phase}
    return len(worker.warmup("generate", window=window, tolerance=tolerance, max_steps=max_steps, max_seconds=60.0))


def test_steady_gpu_steps_are_held_to_the_tolerance():
    # The same lengths as measured: the noise of a steady step is far under 2%, so nothing changes there.
    assert replayed_warmup(TRAIN_BASELINE) == 10
    # compile's first infer windows differ by 2.9% with almost no step-to-step noise: it goes on, as it did.
    assert replayed_warmup(INFER_COMPILE) == 15


def test_noisy_decoding_stops_once_the_noise_explains_the_difference():
    # Measured: 45 and 40 steps, each window pair >2% apart though the steps swing by 10-30% within a window.
    assert replayed_warmup(GENERATE_PATCHED) == 15
    assert replayed_warmup(GENERATE_BASELINE) == 15


def test_a_trend_is_not_taken_for_noise():
    rng = np.random.default_rng(0)
    # Still warming: 1% faster every step, with 0.5% noise. The windows' medians differ by ~5%, and the noise
    # read from successive differences stays near the 1% per step trend, so warm-up goes on to the cap.
    steps = [100 * 0.99 ** i * (1 + 0.005 * rng.standard_normal()) for i in range(50)]
    assert replayed_warmup(steps) == 50
    assert not warm_windows_agree(steps[:5], steps[5:10], 0.02)


def test_the_noise_bound_follows_the_steps_spread():
    rng = np.random.default_rng(1)
    quiet = list(100 + 0.3 * rng.standard_normal(10))
    noisy = list(100 + 15 * rng.standard_normal(10))
    assert warmup_noise_bound(quiet[:5], quiet[5:]) < 0.01
    # iid noise of 15%: two medians of 5 differ by ~0.15 * 1.25 * sqrt(2 / 5) ~ 12% at one standard error.
    assert 0.1 < warmup_noise_bound(noisy[:5], noisy[5:]) < 0.5
    # Identical steps: no noise, so the tolerance alone decides.
    assert warmup_noise_bound([5.0] * 5, [5.0] * 5) == 0.0
    assert warm_windows_agree([100.0] * 5, [101.0] * 5, 0.02) and not warm_windows_agree([100.0] * 5, [103.0] * 5, 0.02)


@pytest.mark.parametrize(("window", "expected"), [(1, 2), (3, 6)])
def test_short_windows_stop_on_the_tolerance(window, expected):
    # A window of one step has no successive differences: the bound is 0 and the tolerance decides (10.0 vs 10.1).
    steps = [10.0, 10.1, 10.05, 10.0, 10.02, 10.01, 10.0]
    assert replayed_warmup(steps, window=window, max_steps=6) == expected
