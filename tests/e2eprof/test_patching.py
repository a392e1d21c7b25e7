"""The patch engine on the real fastsoftmax patch and a real (tiny, random-weight) GPT-2.

Every test that applies a patch reverts it in a `finally`, and the autouse fixture below fails the test if
GPT-2's modeling module or torch was left changed, so one broken revert cannot leak into the rest of the run.
"""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
import transformers.models.gpt2.modeling_gpt2 as modeling_gpt2

from e2eprof.errors import PatchError
from e2eprof.kernels.fastsoftmax.patch import PATCH as FASTSOFTMAX
from e2eprof.kernels.fastsoftmax.patch import softmax_like_torch, softmax_reference
from e2eprof.patch import Patch
from e2eprof.patching import ModuleProxy, apply_patch
from e2eprof.workloads.models import build_model, resolve_model

SOFTMAX_TARGET = "transformers.models.gpt2.modeling_gpt2:nn.functional.softmax"
MLP_TARGET = "transformers.models.gpt2.modeling_gpt2:GPT2MLP"

# Captured at import, before any test patches anything: the genuine objects.
STOCK_SOFTMAX = F.softmax
STOCK_NN = torch.nn
STOCK_TORCH = torch
STOCK_MLP = modeling_gpt2.GPT2MLP
STOCK_MLP_FORWARD = modeling_gpt2.GPT2MLP.__dict__["forward"]
STOCK_LINEAR = torch.nn.Linear


@pytest.fixture(autouse=True)
def nothing_leaks():
    yield
    assert modeling_gpt2.nn is STOCK_NN
    assert modeling_gpt2.torch is STOCK_TORCH
    assert modeling_gpt2.GPT2MLP is STOCK_MLP
    assert STOCK_MLP.__dict__["forward"] is STOCK_MLP_FORWARD
    assert torch.nn.functional.softmax is STOCK_SOFTMAX
    assert torch.nn.Linear is STOCK_LINEAR


def tiny_gpt2(attn_implementation: str = "eager") -> torch.nn.Module:
    return build_model(resolve_model("gpt2-tiny"), attn_implementation=attn_implementation, seed=0)


@pytest.fixture
def model():
    return tiny_gpt2()


@pytest.fixture
def input_ids():
    return torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))


def logits(model, input_ids) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids).logits


def softmax_patch(replacement, **changes) -> Patch:
    """The real fastsoftmax patch with another replacement (same target, reference and tolerances)."""
    return dataclasses.replace(FASTSOFTMAX, replacement=replacement, **changes)


class TestFastSoftmaxOnGPT2:
    def test_sites_proxy_calls_outputs_and_revert(self, model, input_ids):
        expected = logits(model, input_ids)
        applied = apply_patch(FASTSOFTMAX, model)
        try:
            assert applied.n_sites == 1
            assert applied.sites == [{"target": SOFTMAX_TARGET, "kind": "function", "count": 1}]
            # Only GPT-2's modeling module sees the replacement, through a proxy of torch.nn ...
            assert isinstance(modeling_gpt2.nn, ModuleProxy)
            assert modeling_gpt2.nn is not torch.nn
            assert modeling_gpt2.nn.functional.softmax is applied.recorders[0]
            assert modeling_gpt2.nn.Linear is torch.nn.Linear  # everything else passes through
            # ... while torch itself keeps the stock function for the rest of the process.
            assert torch.nn.functional.softmax is STOCK_SOFTMAX
            assert F.softmax is STOCK_SOFTMAX
            torch.nn.functional.softmax(torch.randn(3, 4), dim=-1)
            assert applied.calls == 0

            got = logits(model, input_ids)
            assert applied.calls > 0
            assert applied.calls == model.config.n_layer  # one softmax per attention layer
            signatures = applied.signatures()
            # (B, nh, T, T) attention scores, softmaxed over the last dim.
            assert signatures == {f"float32[2,{model.config.n_head},16,16], dim=-1": model.config.n_layer}
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
        finally:
            applied.revert()
        assert modeling_gpt2.nn is STOCK_NN
        # Reverted: the model runs the stock path again and the recorder sees nothing more.
        calls = applied.calls
        torch.testing.assert_close(logits(model, input_ids), expected, rtol=0, atol=0)
        assert applied.calls == calls

    def test_revert_twice_is_harmless(self, model):
        applied = apply_patch(FASTSOFTMAX, model)
        applied.revert()
        applied.revert()
        assert modeling_gpt2.nn is STOCK_NN

    def test_works_without_a_model(self):
        applied = apply_patch(FASTSOFTMAX)
        try:
            assert applied.n_sites == 1
            assert modeling_gpt2.nn.functional.softmax is applied.recorders[0]
        finally:
            applied.revert()

    def test_sdpa_model_is_refused(self):
        sdpa = tiny_gpt2("sdpa")
        with pytest.raises(PatchError, match="attn_implementation") as info:
            apply_patch(FASTSOFTMAX, sdpa)
        assert "eager" in str(info.value) and "sdpa" in str(info.value)
        assert modeling_gpt2.nn is STOCK_NN

    def test_other_architecture_is_refused(self, model):
        llama_only = softmax_patch(softmax_like_torch, architectures=("llama",))
        with pytest.raises(PatchError, match="llama") as info:
            apply_patch(llama_only, model)
        assert "'gpt2'" in str(info.value)
        assert modeling_gpt2.nn is STOCK_NN


class TestTargets:
    def test_missing_attribute_is_named_and_nothing_changes(self, model):
        # The valid target comes first: applying it before resolving the second would leave it installed.
        patch = softmax_patch(softmax_like_torch, targets=(SOFTMAX_TARGET, SOFTMAX_TARGET + "_v2"))
        with pytest.raises(PatchError) as info:
            apply_patch(patch, model)
        message = str(info.value)
        assert "softmax_v2" in message
        assert "torch.nn.functional" in message or "nn.functional" in message
        assert modeling_gpt2.nn is STOCK_NN

    def test_missing_module_is_named(self):
        patch = softmax_patch(softmax_like_torch, targets=("transformers.models.no_such_model:softmax",))
        with pytest.raises(PatchError, match="no_such_model"):
            apply_patch(patch)

    def test_two_targets_through_the_same_shared_module_both_take_effect(self, model, input_ids):
        # Both paths start at modeling_gpt2.torch: the second proxy must extend the first, not replace it.
        calls = []

        def counting_softmax(input, dim=None, _stacklevel=3, dtype=None):
            calls.append(dim)
            return STOCK_SOFTMAX(input, dim=dim, dtype=dtype)

        patch = Patch(
            name="both",
            targets=(
                "transformers.models.gpt2.modeling_gpt2:torch.softmax",
                "transformers.models.gpt2.modeling_gpt2:torch.nn.functional.softmax",
            ),
            replacement=counting_softmax,
        )
        applied = apply_patch(patch, model)
        try:
            assert applied.n_sites == 2
            first, second = applied.recorders
            assert modeling_gpt2.torch.softmax is first
            assert modeling_gpt2.torch.nn.functional.softmax is second
            assert torch.softmax is not first and torch.nn.functional.softmax is STOCK_SOFTMAX
            modeling_gpt2.torch.softmax(torch.randn(2, 3), dim=-1)
            assert first.calls == 1 and calls == [-1]
        finally:
            applied.revert()
        assert modeling_gpt2.torch is STOCK_TORCH

    def test_method_target_is_refused(self, model, input_ids):
        expected = logits(model, input_ids)
        patch = Patch(name="mlpfwd", targets=(MLP_TARGET + ".forward",), replacement=lambda *a, **k: None)
        with pytest.raises(PatchError, match="class GPT2MLP"):
            apply_patch(patch, model)
        assert STOCK_MLP.__dict__["forward"] is STOCK_MLP_FORWARD
        torch.testing.assert_close(logits(model, input_ids), expected, rtol=0, atol=0)


class FasterMLP(modeling_gpt2.GPT2MLP):
    """A replacement class: same computation, observable calls."""

    calls = 0

    def forward(self, hidden_states):
        FasterMLP.calls += 1
        return super().forward(hidden_states)


class NotAnMLP(torch.nn.Module):
    def forward(self, hidden_states):
        return hidden_states


class TestClassTargets:
    def test_subclass_replaces_instances_and_revert_restores(self, model, input_ids):
        expected = logits(model, input_ids)
        mlps = [m for m in model.modules() if type(m) is STOCK_MLP]
        assert len(mlps) == model.config.n_layer == 2
        patch = Patch(name="fastermlp", targets=(MLP_TARGET,), replacement=FasterMLP)
        applied = apply_patch(patch, model)
        try:
            assert applied.n_sites == 2
            assert applied.sites == [{"target": MLP_TARGET, "kind": "class", "count": 2}]
            assert modeling_gpt2.GPT2MLP is FasterMLP
            assert all(type(m) is FasterMLP for m in mlps)
            FasterMLP.calls = 0
            torch.testing.assert_close(logits(model, input_ids), expected, rtol=0, atol=0)
            assert FasterMLP.calls == 2
        finally:
            applied.revert()
        assert modeling_gpt2.GPT2MLP is STOCK_MLP
        assert all(type(m) is STOCK_MLP for m in mlps)
        assert not any(type(m) is FasterMLP for m in model.modules())

    def test_non_subclass_is_refused_and_earlier_targets_are_undone(self, model):
        # The function target is installed first, then the class target fails: the engine must undo the first.
        patch = Patch(name="notmlp", targets=(SOFTMAX_TARGET, MLP_TARGET), replacement=NotAnMLP)
        with pytest.raises(PatchError, match="subclass of GPT2MLP"):
            apply_patch(patch, model)
        assert modeling_gpt2.nn is STOCK_NN
        assert modeling_gpt2.GPT2MLP is STOCK_MLP
        assert all(type(m) is not NotAnMLP for m in model.modules())

    def test_class_through_a_shared_module_is_scoped_to_the_modeling_module(self, model):
        class MyLinear(torch.nn.Linear):
            pass

        target = "transformers.models.gpt2.modeling_gpt2:nn.Linear"
        patch = Patch(name="mylinear", targets=(target,), replacement=MyLinear)
        applied = apply_patch(patch, model)
        try:
            assert modeling_gpt2.nn.Linear is MyLinear
            assert torch.nn.Linear is STOCK_LINEAR  # the rest of the process is untouched
            assert applied.n_sites == 1  # GPT-2's only nn.Linear is lm_head
            assert type(model.lm_head) is MyLinear
        finally:
            applied.revert()
        assert type(model.lm_head) is STOCK_LINEAR

    def test_zero_sites_is_refused(self):
        # Without a model there are no instances to count: nothing would be measured.
        patch = Patch(name="fastermlp", targets=(MLP_TARGET,), replacement=FasterMLP)
        with pytest.raises(PatchError, match="zero sites"):
            apply_patch(patch)
        assert modeling_gpt2.GPT2MLP is STOCK_MLP


class PlainLookingTensor(torch.Tensor):
    pass


def scaled_softmax(input, dim=None, _stacklevel=3, dtype=None):
    return STOCK_SOFTMAX(input, dim=dim, dtype=dtype) * 1.01


def float64_softmax(input, dim=None, _stacklevel=3, dtype=None):
    return STOCK_SOFTMAX(input.double(), dim=dim)


def subclass_softmax(input, dim=None, _stacklevel=3, dtype=None):
    return STOCK_SOFTMAX(input, dim=dim, dtype=dtype).as_subclass(PlainLookingTensor)


def verified_checks(patch, model, input_ids):
    applied = apply_patch(patch, model)
    try:
        applied.set_verify(True)
        logits(model, input_ids)
        return applied.checks()
    finally:
        applied.revert()


class TestVerifyMode:
    def test_real_kernel_passes(self, model, input_ids):
        checks = verified_checks(FASTSOFTMAX, model, input_ids)
        assert len(checks) == 1
        (check,) = checks
        assert check.signature == f"float32[2,{model.config.n_head},16,16], dim=-1"
        assert check.calls == model.config.n_layer
        assert check.passed, check.problems
        assert check.problems == []
        assert check.tolerance >= FASTSOFTMAX.tolerance_for("float32")
        assert 0 <= check.patched_error <= check.tolerance
        assert 0 < check.stock_error < 1e-6  # fp32 softmax against the fp64 reference

    def test_no_checks_without_verify(self, model, input_ids):
        applied = apply_patch(FASTSOFTMAX, model)
        try:
            logits(model, input_ids)
            assert applied.calls > 0 and applied.checks() == []
        finally:
            applied.revert()

    def test_wrong_values_fail(self, model, input_ids):
        (check,) = verified_checks(softmax_patch(scaled_softmax), model, input_ids)
        assert not check.passed
        assert check.patched_error == pytest.approx(0.01, rel=1e-3)
        assert any("relative error" in p for p in check.problems)

    def test_wrong_dtype_fails(self, model, input_ids):
        (check,) = verified_checks(softmax_patch(float64_softmax), model, input_ids)
        assert not check.passed
        assert any("dtype float64 != stock float32" in p for p in check.problems), check.problems

    def test_tensor_subclass_fails(self, model, input_ids):
        (check,) = verified_checks(softmax_patch(subclass_softmax), model, input_ids)
        assert not check.passed
        assert any("PlainLookingTensor" in p and "plain torch.Tensor" in p for p in check.problems), check.problems

    def test_without_reference_the_stock_output_is_the_yardstick(self, model, input_ids):
        patch = softmax_patch(scaled_softmax, reference=None)
        (check,) = verified_checks(patch, model, input_ids)
        assert not check.passed
        assert check.stock_error == 0.0

    def test_reference_is_called_in_float64(self, model, input_ids):
        seen = []

        def recording_reference(input, dim=None, _stacklevel=3, dtype=None):
            seen.append(input.dtype)
            return softmax_reference(input, dim=dim)

        verified_checks(softmax_patch(softmax_like_torch, reference=recording_reference), model, input_ids)
        assert seen and set(seen) == {torch.float64}
