"""compare_captures: each arm's outputs against the fp64 reference, with the stock arm as the yardstick."""

import pytest
import torch
from safetensors.torch import save_file

from e2eprof.checks.correctness import compare_captures
from e2eprof.kernels.fastsoftmax.patch import PATCH


def _save(tmp_path, name, tensors):
    path = tmp_path / f"{name}.safetensors"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return str(path)


def _captures(tmp_path, reference, arms):
    return _save(tmp_path, "ref", reference), {arm: _save(tmp_path, arm, t) for arm, t in arms.items()}


def _rows(tmp_path, reference, arms):
    ref_path, paths = _captures(tmp_path, reference, arms)
    rows = compare_captures("train", ref_path, paths, PATCH, "fp32")
    return {(r["arm"], r["tensor"]): r for r in rows}


def noisy(t, scale, seed):
    g = torch.Generator().manual_seed(seed)
    return (t + scale * torch.randn(t.shape, generator=g, dtype=torch.float64)).float()


def test_relative_error_within_k_times_stock_passes_and_beyond_fails(tmp_path):
    ref = {"logits": torch.randn(4, 50, dtype=torch.float64, generator=torch.Generator().manual_seed(0))}
    rows = _rows(tmp_path, ref, {"baseline": {"logits": noisy(ref["logits"], 1e-4, 1)},
                                 "patched": {"logits": noisy(ref["logits"], 1.5e-4, 2)},
                                 "bad": {"logits": noisy(ref["logits"], 1e-3, 3)}})
    assert rows[("patched", "logits")]["passed"] and not rows[("bad", "logits")]["passed"]
    assert rows[("bad", "logits")]["tolerance"] == pytest.approx(2 * rows[("baseline", "logits")]["value"])


def test_a_gradient_that_is_zero_in_exact_arithmetic_is_judged_against_the_model_gradient(tmp_path):
    g = torch.Generator().manual_seed(0)
    big = torch.randn(64, 64, dtype=torch.float64, generator=g)
    zero = torch.zeros(64, dtype=torch.float64)
    reference = {"grad/w": big, "grad/key.bias": zero}
    # Both arms' key.bias gradients are pure rounding noise, the patched one 3x the stock one: noise over noise.
    rows = _rows(tmp_path, reference, {
        "baseline": {"grad/w": noisy(big, 1e-7, 1), "grad/key.bias": noisy(zero, 1e-9, 2)},
        "patched": {"grad/w": noisy(big, 1e-7, 3), "grad/key.bias": noisy(zero, 3e-9, 4)},
        "cheat": {"grad/w": noisy(big, 1e-7, 5), "grad/key.bias": noisy(zero, 1e-2, 6)},
    })
    bias = rows[("patched", "grad/key.bias")]
    assert bias["metric"] == "error_vs_model_gradient_norm" and bias["passed"]
    assert not rows[("cheat", "grad/key.bias")]["passed"]  # a real error in that gradient is still caught
    assert rows[("patched", "grad/w")]["metric"] == "rel_error_vs_fp64"
    assert rows[("patched", "grad/*")]["passed"] and not rows[("cheat", "grad/*")]["passed"]


def test_shape_mismatch_and_missing_outputs_fail(tmp_path):
    ref = {"logits": torch.ones(2, 3, dtype=torch.float64), "loss": torch.tensor(1.0, dtype=torch.float64)}
    rows = _rows(tmp_path, ref, {"baseline": {k: v.float() for k, v in ref.items()},
                                 "patched": {"logits": torch.ones(3, 2)}})
    assert rows[("patched", "logits")]["metric"] == "shape_mismatch" and not rows[("patched", "logits")]["passed"]
    assert not rows[("patched", "loss")]["passed"] and rows[("patched", "loss")]["metric"] == "missing_outputs"


def test_one_reference_and_baseline_are_measured_once_and_again_when_a_file_changes(tmp_path, monkeypatch):
    """The revalidation and later candidates judge against the same two files: the reference's norms and the
    baseline's errors are reused, with the same rows; a rewritten reference is measured afresh."""
    import e2eprof.checks.correctness as correctness

    calls = []
    real = correctness.reference_facts
    monkeypatch.setattr(correctness, "reference_facts", lambda t: calls.append(1) or real(t))
    g = torch.Generator().manual_seed(0)
    ref = {"logits": torch.randn(4, 50, dtype=torch.float64, generator=g),
           "grad/w": torch.randn(8, 8, dtype=torch.float64, generator=g)}
    arms = {"baseline": {k: noisy(v, 1e-4, 1) for k, v in ref.items()},
            "patched": {k: noisy(v, 1.5e-4, 2) for k, v in ref.items()}}
    ref_path, paths = _captures(tmp_path, ref, arms)
    first = compare_captures("train", ref_path, paths, PATCH, "fp32")
    assert len(calls) == 2
    again = compare_captures("train", ref_path, dict(paths), PATCH, "fp32")  # as the revalidation asks
    assert len(calls) == 2 and again == first
    _save(tmp_path, "ref", {k: 2 * v for k, v in ref.items()} | {"extra": torch.zeros(3, dtype=torch.float64)})
    changed = compare_captures("train", ref_path, paths, PATCH, "fp32")
    assert len(calls) == 5 and changed != first
