"""The profiling phase on a real tiny GPT-2 training step (CPU): module paths, backward linking, replaced region."""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.nn.functional as F

from e2eprof.patch import Patch
from e2eprof.patching import apply_patch
from e2eprof.trackers.profiling import (
    MODULE_PREFIX,
    OUTSIDE,
    REPLACED_PREFIX,
    UNATTRIBUTED,
    ProfileResult,
    check_complete,
    module_ranges,
    profile_workload,
    replaced_region,
)
from e2eprof.workloads.loops import make_workload
from e2eprof.workloads.models import build_model, resolve_model

_STOCK_SOFTMAX = F.softmax


def _softmax_in_region(*args, **kwargs):
    # What the lead's recorder does in both arms: the replaced call runs inside the region's range.
    with replaced_region("x"):
        return _STOCK_SOFTMAX(*args, **kwargs)


@pytest.fixture(scope="module")
def train_profile():
    model = build_model(resolve_model("gpt2-tiny"), attn_implementation="eager", seed=0)
    patch = Patch(name="x", targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
                  replacement=_softmax_in_region)
    applied = apply_patch(patch, model)
    try:
        workload = make_workload("train", model, torch.device("cpu"), "fp32")
        batch = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(0))
        result = profile_workload(lambda: workload.step(batch), model, device=torch.device("cpu"), warmup=1, active=2)
        calls = applied.calls
    finally:
        applied.revert()
    return result, calls, model


def _rows(result, **match):
    return [r for r in result.ops if all(r[k] == v for k, v in match.items())]


def test_forward_ops_carry_module_paths(train_profile):
    result, _, _ = train_profile
    modules = {r["module"] for r in result.ops}
    assert {"transformer.h.0.attn", "transformer.h.1.mlp.c_fc", "lm_head", "<root>"} <= modules
    assert _rows(result, module="transformer.h.0.attn.c_attn", op="aten::addmm", direction="fwd")
    assert result.active_steps == 2 and len(result.step_walls_us) == 2 and result.step_wall_us > 0


def test_backward_ops_are_linked_to_their_forward_modules(train_profile):
    result, _, _ = train_profile
    bwd = [r for r in result.ops if r["direction"] == "bwd"]
    attributed = [r for r in bwd if r["module"] not in (UNATTRIBUTED, OUTSIDE)]
    assert attributed and len(attributed) > len(bwd) // 2
    # Conv1D's addmm backward runs as mm ops under AddmmBackward0, linked back to the layer's c_fc.
    assert _rows(result, module="transformer.h.1.mlp.c_fc", op="AddmmBackward0", direction="bwd")
    assert _rows(result, module="transformer.h.1.mlp.c_fc", op="aten::mm", direction="bwd")
    # AccumulateGrad has no forward op: kept, counted and labelled, never dropped.
    assert result.unattributed_events > 0 and result.unattributed_cpu_us > 0
    assert any("AccumulateGrad" in r["op"] for r in _rows(result, module=UNATTRIBUTED))


def test_replaced_region_covers_softmax_forward_and_its_backward(train_profile):
    result, calls, _ = train_profile
    assert calls == 2 * 3  # 2 layers x (1 warm-up + 2 active) steps
    fwd = _rows(result, op="aten::_softmax", direction="fwd")
    assert fwd and all(r["in_replaced"] and r["module"] == REPLACED_PREFIX + "x" for r in fwd)
    assert sum(r["count"] for r in fwd) == 2  # per active step: one per layer
    bwd = _rows(result, op="aten::_softmax_backward_data")
    assert bwd and all(r["in_replaced"] and r["direction"] == "bwd" for r in bwd)
    # The loss's log_softmax is a different op outside the region.
    assert all(not r["in_replaced"] for r in _rows(result, op="aten::_log_softmax"))
    assert result.replaced_cpu_us == pytest.approx(result.replaced_fwd_cpu_us + result.replaced_bwd_cpu_us)
    assert result.replaced_fwd_cpu_us > 0 and result.replaced_bwd_cpu_us > 0
    assert 0 < result.replaced_cpu_us < result.total_cpu_us


def test_cpu_profile_has_no_device_time_and_keeps_every_cpu_microsecond(train_profile):
    result, _, _ = train_profile
    assert result.total_device_us == 0 and result.kernels == []
    assert result.idle_share != result.idle_share  # NaN on CPU
    assert result.total_cpu_us == pytest.approx(sum(r["self_cpu_us"] for r in result.ops))
    # One thread on CPU: self times of everything add up to the steps' wall time.
    assert result.total_cpu_us == pytest.approx(result.step_wall_us, rel=0.02)


def test_profile_result_pickles(train_profile):
    result, _, _ = train_profile
    clone = pickle.loads(pickle.dumps(result))
    assert isinstance(clone, ProfileResult) and clone.ops == result.ops
    assert ProfileResult.from_dict(result.to_dict()).replaced_cpu_us == result.replaced_cpu_us


def test_check_complete_reports_missing_kernels_and_missing_modules(train_profile):
    result, _, _ = train_profile
    assert check_complete(result, device_type="cpu", expected_kernel_substrings=("softmax",)) == []
    problems = check_complete(result, device_type="cpu", expected_kernel_substrings=("_softmax_fwd_triton",))
    assert len(problems) == 1 and "_softmax_fwd_triton" in problems[0]
    cuda_problems = check_complete(result, device_type="cuda", expected_kernel_substrings=("_softmax_fwd",))
    assert any("zero device time" in p for p in cuda_problems)
    assert any("_softmax_fwd" in p for p in cuda_problems)
    stripped = result.to_dict() | {"ops": [r | {"module": OUTSIDE} for r in result.ops]}
    assert any("no op was attributed" in p for p in check_complete(stripped, device_type="cpu"))


def test_module_ranges_remove_their_hooks_and_survive_exceptions(train_profile):
    _, _, model = train_profile
    block = model.transformer.h[0]

    def boom(module, args):
        raise RuntimeError("boom")

    handle = block.mlp.register_forward_pre_hook(boom)
    ids = torch.randint(0, 512, (1, 8))
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            with pytest.raises(RuntimeError, match="boom"), module_ranges(model):
                model(input_ids=ids)
            with module_ranges(model):
                model.transformer.wte(ids)  # ranges still work after the failure
    finally:
        handle.remove()
    assert not any(m._forward_pre_hooks for m in model.modules())
    assert not any(m._forward_hooks for m in model.modules())
    names = [e.name for e in prof.events()]
    assert names.count(MODULE_PREFIX + "transformer.h.0") == 1  # opened and closed once despite the error
    assert MODULE_PREFIX + "transformer.wte" in names


def _event(name, thread, start, end, *, seq=-1, fwd_thread=None, scope=0, kernels=(), device=False, corr=0):
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    evt = FunctionEvent(id=corr, name=name, thread=thread, start_us=start, end_us=end, fwd_thread=fwd_thread,
                        input_shapes=[], scope=scope, use_device="cuda", sequence_nr=seq,
                        device_type=DeviceType.CUDA if device else DeviceType.CPU, linked_correlation_id=corr)
    for kernel_name, duration in kernels:
        evt.append_kernel(kernel_name, 0, duration)
    return evt


def test_summarize_a_cuda_shaped_trace_links_backward_across_threads():
    """A hand-built kineto-shaped trace: forward on thread 1, backward on the autograd device thread 2."""
    from torch.autograd.profiler_util import EventList

    from e2eprof.trackers.profiling import summarize_events

    events = [
        _event("ProfilerStep#4", 1, 0, 1000),
        _event("module::<root>", 1, 10, 400),
        _event("module::transformer.h.0.attn", 1, 20, 300),
        _event("e2eprof.replaced::x", 1, 30, 100),
        _event("aten::_softmax", 1, 40, 90, seq=5, kernels=[("softmax_fwd", 50.0)], corr=11),
        _event("aten::add", 1, 110, 150, seq=6, kernels=[("add_kernel", 10.0)], corr=12),
        _event("autograd::engine::evaluate_function: SoftmaxBackward0", 2, 500, 600, seq=5, fwd_thread=1),
        _event("SoftmaxBackward0", 2, 505, 595, seq=5, fwd_thread=1, scope=1),
        _event("aten::_softmax_backward_data", 2, 510, 590, kernels=[("softmax_bwd", 70.0)], corr=13),
        _event("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 2, 650, 700, fwd_thread=1),
        _event("softmax_fwd", 7, 60, 110, device=True, corr=11),
        _event("add_kernel", 7, 160, 170, device=True, corr=12),
        _event("softmax_bwd", 7, 600, 670, device=True, corr=13),
        _event("nccl_orphan", 7, 800, 820, device=True, corr=99),  # launched by no CPU event we saw
    ]
    trace = EventList(events, use_device="cuda")
    trace._build_tree()
    result = summarize_events(trace, device_type="cuda", active_steps=1)

    assert result.total_device_us == pytest.approx(150.0)
    assert result.replaced_fwd_device_us == pytest.approx(50.0)
    assert result.replaced_bwd_device_us == pytest.approx(70.0)
    assert result.replaced_device_us == pytest.approx(120.0)
    bwd = _rows(result, op="aten::_softmax_backward_data")[0]
    assert bwd["module"] == REPLACED_PREFIX + "x" and bwd["in_replaced"] and bwd["direction"] == "bwd"
    assert bwd["kernels"] == "softmax_bwd"
    assert _rows(result, op="aten::add")[0]["module"] == "transformer.h.0.attn"
    orphan = _rows(result, module=UNATTRIBUTED, op="<kernels without a launching op>")[0]
    assert orphan["self_device_us"] == pytest.approx(20.0) and result.unlinked_kernel_us == pytest.approx(20.0)
    assert sum(r["self_device_us"] for r in result.ops) == pytest.approx(result.total_device_us)  # nothing dropped
    assert _rows(result, op="autograd::engine::evaluate_function: torch::autograd::AccumulateGrad")[0]["module"] \
        == UNATTRIBUTED
    # Device busy 150 us of the 1000 us step.
    assert result.idle_share == pytest.approx(0.85)
    assert result.step_wall_us == pytest.approx(1000.0)
    kernels = {(k["kernel"], k["op"]): k for k in result.kernels}
    assert kernels[("softmax_fwd", "aten::_softmax")]["median_us"] == 50.0
    assert ("nccl_orphan", "<kernels without a launching op>") in kernels
    assert check_complete(result, device_type="cuda", expected_kernel_substrings=("softmax_fwd",)) == []


def test_a_recorded_profile_is_summarized_later_and_once(train_profile):
    # The run records every arm's profile, then summarizes them all at once: the events must survive the profiler's
    # exit and another profile recorded in between, and give the same table as summarizing at once.
    from e2eprof.trackers.profiling import record_profile

    _, _, model = train_profile
    workload = make_workload("infer", model, torch.device("cpu"), "fp32")
    batch = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    first = record_profile(lambda: workload.step(batch), model, device=torch.device("cpu"), warmup=1, active=2)
    second = record_profile(lambda: workload.step(batch[:1]), model, device=torch.device("cpu"), warmup=0, active=1)
    summary = first.summarize()
    assert summary.active_steps == 2 and len(summary.step_walls_us) == 2
    def embedding_shapes(result):
        return " ".join(r["input_shapes"] for r in result.ops if r["op"] == "aten::embedding")

    # The token embedding (512 x 64) saw each profile's own batch.
    assert "[[512, 64], [2, 16]" in embedding_shapes(summary) and "[[512, 64], [1, 16]" not in embedding_shapes(summary)
    assert "[[512, 64], [1, 16]" in embedding_shapes(second.summarize())
    with pytest.raises(RuntimeError, match="already summarized"):
        first.summarize()
