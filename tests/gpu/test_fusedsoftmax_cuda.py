"""fusedsoftmax on CUDA: the compiled Triton kernels at GPT-2's attention shape, forward and backward, against fp64,
then the replaced attention function against the stock one under bf16 autocast.

The CPU suite runs the same kernels under the interpreter; this one catches what only compilation shows
(num_warps, register limits, the looped kernels' codegen, int64 offsets, the stride-0 mask reads).
"""

import types

import pytest
import torch
from transformers.models.gpt2 import modeling_gpt2

from e2eprof.kernels.fusedsoftmax import IMPL_CALLS, fusedsoftmax, reference_fusedsoftmax
from e2eprof.kernels.fusedsoftmax.patch import fused_eager_attention_forward

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

F32, BF16 = torch.float32, torch.bfloat16
TOL = {F32: 1e-5, BF16: 1e-2}  # relative-norm error by dtype, as in tests/kernels/test_fusedsoftmax.py
ATTN = (8, 12, 1024, 1024)  # (B, nh, T, S): GPT-2 124M at batch 8 x 1024
STOCK_EAGER = modeling_gpt2.eager_attention_forward


def _randn(shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=g, device="cuda", dtype=F32).to(dtype)


def _causal_mask(B, T, S, pad=0):
    """(B, 1, T, S) fp32 additive mask as transformers builds it; the last batch item has `pad` left-padded keys."""
    visible = (torch.arange(S, device="cuda")[None, :] <= torch.arange(T, device="cuda")[:, None] + (S - T))
    visible = visible.expand(B, 1, T, S).clone()
    visible[-1, :, :, :pad] = False
    return torch.where(visible, torch.zeros((), device="cuda"), torch.finfo(F32).min)


def _check(out, ref, tol):
    assert type(out) is torch.Tensor and out.shape == ref.shape
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    keep = ~torch.isnan(ref)
    err = ((out.double() - ref)[keep].norm() / ref[keep].norm()).item()
    assert err <= tol, f"relative-norm error {err:.3g} > {tol:g}"


@pytest.mark.parametrize("s_dtype,out_dtype", [(BF16, BF16), (F32, F32), (BF16, F32)],
                         ids=["bf16-bf16 (autocast)", "f32-f32", "bf16-f32"])
def test_attention_shape_fwd_bwd(s_dtype, out_dtype):
    scores = (_randn(ATTN, s_dtype, seed=0) * 3).requires_grad_()
    mask = _causal_mask(ATTN[0], ATTN[2], ATTN[3], pad=100)
    fwd, bwd = IMPL_CALLS["triton.fwd"], IMPL_CALLS["triton.bwd"]
    y = fusedsoftmax(scores, mask, 0.125, out_dtype)
    assert IMPL_CALLS["triton.fwd"] == fwd + 1
    assert y.dtype == out_dtype and y.is_cuda and y.is_contiguous()
    # The fp64 reference of the whole tensor is 800 MiB per copy: check batch items 0 and the padded last one.
    for b in (0, ATTN[0] - 1):
        _check(y[b:b + 1], reference_fusedsoftmax(scores.detach()[b:b + 1], mask[b:b + 1], 0.125), TOL[out_dtype])

    dy = _randn(ATTN, out_dtype, seed=1)
    (dx,) = torch.autograd.grad(y, scores, dy)
    assert IMPL_CALLS["triton.bwd"] == bwd + 1 and dx.dtype == s_dtype
    for b in (0, ATTN[0] - 1):
        s64 = scores.detach()[b:b + 1].double().requires_grad_()
        (dx_ref,) = torch.autograd.grad(reference_fusedsoftmax(s64, mask[b:b + 1], 0.125), s64, dy[b:b + 1].double())
        _check(dx[b:b + 1], dx_ref, max(TOL[s_dtype], TOL[out_dtype]))
    hidden = (mask == torch.finfo(F32).min).expand(ATTN)
    hidden = hidden & ~hidden.all(dim=-1, keepdim=True)
    assert not y[hidden].any() and not dx[hidden].any()  # masked positions: zero probability, zero gradient


@pytest.mark.parametrize("shape", [(2, 12, 1, 1024), (2, 4, 3, 20000)], ids=["decode-T1", "looped-20000"])
def test_other_shapes(shape):
    B, H, T, S = shape
    scores = _randn(shape, BF16, seed=2).requires_grad_()
    mask = _causal_mask(B, T, S, pad=5)
    y = fusedsoftmax(scores, mask, 0.125, BF16)
    _check(y, reference_fusedsoftmax(scores.detach(), mask, 0.125), TOL[BF16])
    dy = _randn(shape, BF16, seed=3)
    (dx,) = torch.autograd.grad(y, scores, dy)
    s64 = scores.detach().double().requires_grad_()
    (dx_ref,) = torch.autograd.grad(reference_fusedsoftmax(s64, mask, 0.125), s64, dy.double())
    _check(dx, dx_ref, TOL[BF16])


def test_replacement_matches_stock_under_autocast():
    module = types.SimpleNamespace(training=False)
    q, k, v = (_randn((8, 12, 1024, 64), F32, seed=s) for s in (4, 5, 6))
    mask = _causal_mask(8, 1024, 1024, pad=7)
    with torch.autocast("cuda", dtype=BF16):
        stock = STOCK_EAGER(module, q, k, v, mask, scaling=0.125)
        got = fused_eager_attention_forward(module, q, k, v, mask, scaling=0.125)
    for name, g, s in zip(("attn_output", "attn_weights"), got, stock):
        assert (g.dtype, g.shape, g.stride()) == (s.dtype, s.shape, s.stride()), name
        err = ((g.float() - s.float()).norm() / s.float().norm()).item()
        assert err < 1e-2, f"{name}: relative-norm difference from stock {err:.3g}"
