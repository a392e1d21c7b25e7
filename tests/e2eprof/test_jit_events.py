"""Just-in-time work is counted per phase, and any inside timed steps withholds the speed verdict."""

from __future__ import annotations

import math

import pytest
import torch

from e2eprof.trackers import jit_events
from e2eprof.config import CompareConfig
from e2eprof.analysis.summary import summarize
from tests.e2eprof.test_summary import clean_checks, steps_for


def test_torch_compile_graphs_are_counted():
    jit_events.install()
    before = jit_events.snapshot()

    @torch.compile(backend="eager")
    def double(x):
        return x * 2

    double(torch.ones(3))
    double(torch.ones(3))  # cached: no new graph
    after = jit_events.snapshot()
    assert jit_events.delta(before, after)["compile_graphs"] == 1


def test_the_triton_hook_counts_and_keeps_an_earlier_hook():
    knobs = pytest.importorskip("triton.knobs")
    jit_events.install()
    hook = knobs.runtime.jit_post_compile_hook
    assert hook is not None
    before = jit_events.snapshot()["triton_compiles"]
    hook(key="k", repr="r", fn=None, compile={}, is_manual_warmup=False, already_compiled=False)
    assert jit_events.snapshot()["triton_compiles"] == before + 1


def jit_row(arm, phase, replica=0, **counts):
    return {"workload": "train", "arm": arm, "replica": replica, "rank": 0, "phase": phase,
            **{name: float(counts.get(name, 0)) for name in jit_events.COUNTS}}


def test_compilation_inside_timed_steps_withholds_the_speed_verdict():
    config = CompareConfig(model="gpt2-tiny", patch="fastsoftmax", device="cpu", workloads=("train",),
                           reference_arms=(), process_noise=0.0)
    steps = steps_for("train", "baseline", 100, noise=0.002) + steps_for("train", "patched", 90, noise=0.002)
    checks = clean_checks("train", ["baseline", "patched"])
    _, clean = summarize(steps, checks, config, set(), jit=[jit_row("patched", "cold", triton_compiles=4)])
    assert clean["train"].verdict == "PASS"  # compiling in the cold step is what the cold step is for
    jit = [jit_row("patched", "cold", triton_compiles=4), jit_row("patched", "timing", replica=1, triton_compiles=2)]
    _, verdicts = summarize(steps, checks, config, set(), jit=jit)
    verdict = verdicts["train"]
    assert verdict.verdict == "INCONCLUSIVE" and verdict.reasons[0] == "JIT_DURING_TIMING", verdict
    assert "patched 2 triton compiles" in verdict.advice
    # a reference arm recompiling during its timing does not touch the candidate's verdict
    _, verdicts = summarize(steps, checks, config, set(), jit=[jit_row("sdpa", "timing", compile_graphs=3)])
    assert verdicts["train"].verdict == "PASS"


def test_a_jit_table_from_before_a_count_existed_is_still_judged():
    """Older reports lack the FX-graph cache counts (added later); re-judging one (`e2eprof gate`) must use the
    counts it has, not fail on the ones it lacks."""
    config = CompareConfig(model="gpt2-tiny", patch="fastsoftmax", device="cpu", workloads=("train",),
                           reference_arms=(), process_noise=0.0)
    steps = steps_for("train", "baseline", 100, noise=0.002) + steps_for("train", "patched", 90, noise=0.002)
    checks = clean_checks("train", ["baseline", "patched"])
    old = ("fxgraph_cache_hits", "fxgraph_cache_misses")
    jit = [{k: v for k, v in jit_row("patched", "timing", triton_compiles=2).items() if k not in old},
           {k: v for k, v in jit_row("baseline", "timing").items() if k not in old}]
    _, verdicts = summarize(steps, checks, config, set(), jit=jit)
    assert verdicts["train"].reasons[0] == "JIT_DURING_TIMING" and "patched 2 triton compiles" in verdicts["train"].advice


def test_counts_that_cannot_be_taken_are_not_zero():
    counts = jit_events.snapshot()
    assert set(counts) == set(jit_events.COUNTS)
    assert all(isinstance(v, float) or isinstance(v, int) for v in counts.values())
    assert not any(isinstance(v, float) and math.isinf(v) for v in counts.values())
