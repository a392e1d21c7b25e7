"""The gate's stress points (e2eprof.checks.stress): inputs across the range an op can meet, judged like the model's calls."""

from __future__ import annotations

import math

import pytest
import torch

from e2eprof.checks import stress
from e2eprof.patch import Patch


def names(points):
    return [name for name, _, _ in points]


def test_the_points_of_a_softmax_call_keep_its_mask_and_stop_at_the_dtypes_range():
    scores = torch.randn(2, 2, 8, 8)
    scores[..., 4:] = torch.finfo(torch.float32).min  # an additive mask's hidden positions
    points = list(stress.points((scores,), {"dim": -1}, 0, "softmax", row_length_free=True))
    labels = names(points)
    assert labels[:3] == ["scale 1e1", "scale 1e2", "scale 1e3"]
    assert "scale 1e32" in labels and "scale 1e38" not in labels  # fp32's range ends near 3.4e38
    assert {"row offset", "outlier channels", "near the dtype's largest", "denormals", "constant rows",
            "fully masked rows (-inf)", "fully masked rows (lowest finite)", "NaN/Inf at masked places",
            "long rows in bf16"} <= set(labels)
    for name, (x,), kwargs in points:
        assert kwargs == {"dim": -1}
        if name.startswith(("scale", "row offset", "outlier", "near", "denormals", "constant")):
            assert x.shape == scores.shape and x.dtype == scores.dtype
            assert torch.equal(x[..., 4:], scores[..., 4:]), f"{name} moved the mask"
    long = dict((n, a) for n, a, _ in points)["long rows in bf16"][0]
    assert long.dtype == torch.bfloat16 and long.shape == (2, 2, 3, stress.LONG_ROW)


def test_an_op_with_weights_gets_no_long_rows_and_none_gets_nothing():
    x = torch.randn(4, 16)
    assert "long rows in bf16" not in names(stress.points((x,), {}, 0, "any", row_length_free=False))
    assert list(stress.points((x,), {}, 0, "none")) == []
    assert list(stress.points((torch.arange(5),), {}, 0, "any")) == []  # integer ids: nothing to move


def test_where_the_stock_op_overflows_the_kernel_is_held_to_it_not_to_fp64():
    reference = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    stock = torch.tensor([1.0, math.inf, 3.0])
    better = torch.tensor([1.0, 2.0, 3.0])  # finite where the stock op broke: fine
    same = torch.tensor([1.0, math.nan, 3.0])  # breaks where it breaks, in its own way: fine
    worse = torch.tensor([math.nan, math.inf, 3.0])  # breaks where the stock op did not: wrong
    assert stress.judge(better, stock, reference, floor=1e-5, factor=2).passed
    assert stress.judge(same, stock, reference, floor=1e-5, factor=2).passed
    assert not stress.judge(worse, stock, reference, floor=1e-5, factor=2).passed
    off = torch.tensor([1.1, math.inf, 3.0])
    assert not stress.judge(off, stock, reference, floor=1e-5, factor=2).passed
    # no overflow: the usual rule, NaN/Inf positions included
    assert not stress.judge(torch.tensor([1.0, math.inf, 3.0]), better, reference, floor=1e-5, factor=2).passed


def test_an_exact_zero_reference_cannot_be_judged_by_a_relative_error():
    assert not stress.judgeable(torch.zeros(3, dtype=torch.float64))
    assert stress.judgeable((torch.zeros(2), torch.ones(2)))


def test_forward_and_backward_run_the_stock_op_and_the_fp64_reference():
    x = torch.randn(3, 5) * 50
    out, ref = stress.forward(torch.softmax, lambda t, dim: torch.softmax(t, dim), (x,), {"dim": -1}, 0, reference=True)
    assert out.dtype == torch.float32 and ref.dtype == torch.float64
    grad, ref_grad = stress.backward(torch.softmax, lambda t, dim: torch.softmax(t, dim), (x,), {"dim": -1}, 0,
                                     reference=True)
    assert grad.shape == x.shape and ref_grad.dtype == torch.float64
    assert torch.allclose(grad.double(), ref_grad, atol=1e-6)
    assert stress.backward(lambda t: t.detach() * 2, None, (x,), {}, 0) == (None, None)  # not differentiable


def test_a_patch_declares_its_domain():
    target = ("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",)
    assert Patch(name="p", targets=target, replacement=torch.softmax).domain == "any"
    assert Patch(name="p", targets=target, replacement=torch.softmax, domain=stress.attention).domain is stress.attention
    with pytest.raises(ValueError, match="domain"):
        Patch(name="p", targets=target, replacement=torch.softmax, domain="softmaxx")


def test_the_attention_domain_masks_rows_of_the_mask_argument():
    q = k = v = torch.randn(1, 2, 6, 4)
    mask = torch.zeros(1, 1, 6, 6)
    points = {name: (args, kwargs) for name, args, kwargs in stress.attention((None, q, k, v, mask), {})}
    assert "scale 1e1" in points and "fully masked rows (-inf)" in points
    masked = points["fully masked rows (-inf)"][0][4]
    assert int(torch.isinf(masked).all(dim=-1).sum()) == stress.MASKED_ROWS
