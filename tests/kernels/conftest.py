"""What every kernel's "patch on a real tiny model" test checks, written once, as the `check_patch_on_model` fixture
(a fixture rather than an import: the tests run with --import-mode=importlib, where test modules cannot import each
other).

check_patch_on_model applies a patch to a real (tiny, random-weight) model and checks, in order: the sites per
target; that the model's instances of a class target now have the replacement class; a no-grad forward makes exactly
one replaced call, and one kernel forward, per site; a training step in verify mode (every call checked against the
stock op and the fp64 reference) runs one kernel backward per site and passes every check; then, after revert, that
logits and every gradient matched stock, and that the model is stock again (classes, no instance forward left, the
same logits bit for bit).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import pytest
import torch

from e2eprof.patch import Patch
from e2eprof.patching import AppliedPatch, apply_patch


def train_step(model: torch.nn.Module, input_ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Logits and every parameter's gradient of one loss step on input_ids as labels (eval mode: no dropout)."""
    model.zero_grad(set_to_none=True)
    out = model(input_ids=input_ids, labels=input_ids)
    out.loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out.logits.detach(), grads


def _logits(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=input_ids).logits


def _check_patch_on_model(patch: Patch, model: torch.nn.Module, input_ids: torch.Tensor, *, impl: str,
                         impl_calls: Counter, sites: Mapping[str, int], logits_atol: float = 1e-5,
                         grad_tol: float = 1e-4) -> AppliedPatch:
    """Apply `patch` to `model`, run the checks in the module docstring, revert; returns the reverted AppliedPatch.

    impl: the implementation expected to run ("cpu" or "triton"); impl_calls: the kernel's IMPL_CALLS; sites:
    {target: count} for every target of the patch (zero where the model has none).
    """
    stock_eval_logits = _logits(model, input_ids)
    stock_logits, stock_grads = train_step(model, input_ids)
    stock_classes = [type(m) for m in model.modules()]
    n = sum(sites.values())
    applied = apply_patch(patch, model)
    try:
        assert {s["target"]: s["count"] for s in applied.sites} == dict(sites)
        assert applied.n_sites == n
        if isinstance(patch.replacement, type):
            assert sum(type(m) is patch.replacement for m in model.modules()) == n

        before = impl_calls.copy()
        logits = _logits(model, input_ids)
        assert applied.calls == n
        assert impl_calls[f"{impl}.fwd"] - before[f"{impl}.fwd"] == n
        torch.testing.assert_close(logits, stock_logits, rtol=0, atol=logits_atol)

        before = impl_calls.copy()
        _, grads = train_step(model, input_ids)
        assert impl_calls[f"{impl}.bwd"] - before[f"{impl}.bwd"] == n  # one backward per site, nothing else
        # Verified, every call is also checked (and the checks call the kernel again: stress points run its backward).
        applied.set_verify(True)
        train_step(model, input_ids)
        applied.set_verify(False)
        checks = applied.checks()
        assert checks and sum(c.calls for c in checks) == n
        assert all(c.stress_points > 0 for c in checks), "no stress point ran"
        assert all(c.passed for c in checks), [c.problems for c in checks]
    finally:
        applied.revert()

    assert grads.keys() == stock_grads.keys()
    # A gradient that is zero in exact arithmetic (an attention key bias: softmax ignores a shift shared by a row) is
    # rounding noise in both runs, so each error is relative to the larger of its own norm and 1e-4 of the norm of
    # all gradients together.
    floor = 1e-4 * torch.stack([g.double().norm() for g in stock_grads.values()]).norm().item()
    for name, grad in grads.items():
        expected = stock_grads[name]
        err = (grad.double() - expected.double()).norm().item() / max(expected.double().norm().item(), floor)
        assert err < grad_tol, f"{name}: relative-norm error {err:.3g}"
    assert [type(m) for m in model.modules()] == stock_classes
    assert not any("forward" in vars(m) for m in model.modules())
    torch.testing.assert_close(_logits(model, input_ids), stock_eval_logits, rtol=0, atol=0)
    return applied


@pytest.fixture
def check_patch_on_model():
    """_check_patch_on_model, for the tests."""
    return _check_patch_on_model
