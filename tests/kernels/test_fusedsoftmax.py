"""Correctness of e2eprof.kernels.fusedsoftmax on CPU: the CPU implementation and the Triton kernels (interpreter),
then the patch on a real tiny GPT-2.

Every op check compares against an fp64 reference with a relative-norm error and requires NaN positions to match
exactly (allclose-style checks pass zeros or NaN, which is what these tests must catch).
"""

import os
import types

import pytest
import torch
from transformers.models.gpt2 import modeling_gpt2

from e2eprof.errors import PatchError
from e2eprof.kernels.fusedsoftmax import IMPL_CALLS, TRITON_AVAILABLE, fusedsoftmax, reference_fusedsoftmax
from e2eprof.kernels.fusedsoftmax import op as fs_op
from e2eprof.kernels.fusedsoftmax.patch import PATCH, eager_attention_reference, fused_eager_attention_forward
from e2eprof.patching import apply_patch
from e2eprof.workloads.models import build_model, resolve_model

F64, F32, BF16, F16 = torch.float64, torch.float32, torch.bfloat16, torch.float16
# Relative-norm tolerance by output dtype: a few units of its rounding (bf16 2^-8, fp16 2^-11, fp32 2^-24).
TOL = {F64: 1e-12, F32: 1e-5, BF16: 1e-2, F16: 2e-3}
STOCK_EAGER = modeling_gpt2.eager_attention_forward  # captured before any test patches anything

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
IMPLS = [
    "cpu",
    pytest.param("triton", marks=pytest.mark.skipif(not (TRITON_AVAILABLE and _INTERPRET),
                                                    reason="needs triton and TRITON_INTERPRET=1")),
]
# The interpreter evaluates -inf - -inf in numpy, which warns; the NaN it yields is the behaviour under test.
_interp_nan_ok = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


@pytest.fixture(params=IMPLS)
def impl(request, monkeypatch):
    """Selects the implementation under test through the same env switch users have."""
    monkeypatch.setenv(fs_op.IMPL_ENV, request.param)
    return request.param


def _randn(shape, dtype, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=F64) * scale).to(dtype)


def _causal_mask(B, T, S, dtype=F32, pad=None):
    """(B, 1, T, S) additive mask as transformers builds it for eager attention: 0 where visible, finfo.min not.

    Query t sits at position S - T + t (cached keys come first). pad[b] hides batch b's first pad[b] keys.
    """
    t = torch.arange(T)[:, None] + (S - T)
    visible = (torch.arange(S)[None, :] <= t).expand(B, 1, T, S).clone()
    if pad is not None:
        for b, n in enumerate(pad):
            visible[b, :, :, :n] = False
    zero = torch.zeros((), dtype=dtype)
    return torch.where(visible, zero, torch.finfo(dtype).min)


def _assert_matches(out, ref, tol):
    assert type(out) is torch.Tensor and out.shape == ref.shape
    nan_out, nan_ref = torch.isnan(out), torch.isnan(ref)
    assert torch.equal(nan_out, nan_ref), f"NaN at {int(nan_out.sum())} positions, reference at {int(nan_ref.sum())}"
    keep = ~nan_ref
    diff, den = (out.double() - ref)[keep].norm(), ref[keep].norm()
    err = (diff / den).item() if den > 0 else diff.item()
    assert err <= tol, f"relative-norm error {err:.3g} > {tol:g}"


# (id, (B, H, T, S), mask kind). Masks: causal (T == S), decode (T=1 with a cache), padding (left-padded batch
# items), broadcast over batch too (1, 1, T, S), none.
CASES = [
    ("causal-odd", (2, 3, 7, 7), "causal"),
    ("causal-T1", (2, 3, 1, 1), "causal"),
    ("decode-T1-S9", (2, 2, 1, 9), "causal"),
    ("prefill-with-cache", (1, 2, 3, 11), "causal"),
    ("padding", (3, 2, 6, 6), "padding"),
    ("mask-1x1xTxS", (2, 2, 5, 5), "shared"),
    ("no-mask", (2, 2, 5, 5), "none"),
]
DTYPES = [(F32, F32, F32), (BF16, F32, BF16), (BF16, F32, F32), (BF16, BF16, BF16), (F16, F32, F16)]  # scores, mask, out


def _inputs(shape, kind, s_dtype, m_dtype, seed=0):
    B, H, T, S = shape
    scores = _randn(shape, s_dtype, seed, scale=4.0)
    if kind == "none":
        return scores, None
    if kind == "shared":
        return scores, _causal_mask(1, T, S, m_dtype)
    return scores, _causal_mask(B, T, S, m_dtype, pad=[0, 2, 4][:B] if kind == "padding" else None)


@pytest.mark.parametrize("s_dtype,m_dtype,out_dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("name,shape,kind", CASES, ids=[c[0] for c in CASES])
def test_forward_and_backward_match_fp64(impl, name, shape, kind, s_dtype, m_dtype, out_dtype):
    _check_fwd_bwd(impl, shape, kind, s_dtype, m_dtype, out_dtype)


@pytest.mark.parametrize("s_dtype,m_dtype,out_dtype", [(F32, F32, F32), (BF16, F32, BF16)],
                         ids=["f32", "bf16-f32mask-bf16"])
def test_rows_longer_than_one_program_holds(impl, s_dtype, m_dtype, out_dtype):
    # S = 17000 is above both one-row limits (16384 forward, 8192 backward): the looped kernels run.
    _check_fwd_bwd(impl, (1, 1, 2, 17000), "causal", s_dtype, m_dtype, out_dtype)


def _check_fwd_bwd(impl, shape, kind, s_dtype, m_dtype, out_dtype):
    scores, mask = _inputs(shape, kind, s_dtype, m_dtype)
    scores.requires_grad_()
    before = (scores.detach().clone(), None if mask is None else mask.clone())
    calls = IMPL_CALLS.copy()
    y = fusedsoftmax(scores, mask, 0.3, out_dtype)
    assert IMPL_CALLS[f"{impl}.fwd"] == calls[f"{impl}.fwd"] + 1
    assert y.dtype == out_dtype and y.is_contiguous()
    assert torch.equal(scores.detach(), before[0]) and (mask is None or torch.equal(mask, before[1]))
    s64 = scores.detach().double().requires_grad_()
    y_ref = reference_fusedsoftmax(s64, mask, 0.3)
    _assert_matches(y, y_ref, TOL[out_dtype])

    dy = _randn(shape, out_dtype, seed=1)
    (dx,) = torch.autograd.grad(y, scores, dy)
    assert IMPL_CALLS[f"{impl}.bwd"] == calls[f"{impl}.bwd"] + 1
    assert dx.dtype == s_dtype and dx.shape == scores.shape
    (dx_ref,) = torch.autograd.grad(y_ref, s64, dy.double())
    # dx carries the rounding of y (out dtype) and of dx itself (scores dtype): the looser tolerance applies.
    _assert_matches(dx, dx_ref, max(TOL[s_dtype], TOL[out_dtype]))
    if mask is not None:
        hidden = (mask == torch.finfo(mask.dtype).min).expand(shape)
        # A row with every key hidden (a padded query) is uniform, as in torch: min + x rounds to min everywhere.
        hidden = hidden & ~hidden.all(dim=-1, keepdim=True)
        assert torch.equal(y[hidden].float(), torch.zeros(int(hidden.sum()))), "masked positions must be 0"
        assert torch.equal(dx[hidden].float(), torch.zeros(int(hidden.sum()))), "masked positions get zero grad"


@_interp_nan_ok
def test_inf_mask_and_nan_like_torch(impl):
    scores = _randn((1, 2, 3, 8), F32, seed=2)
    mask = torch.zeros(1, 1, 3, 8)
    mask[0, 0, 0] = -float("inf")  # a fully hidden row: torch gives NaN
    mask[0, 0, 1, :5] = -float("inf")
    scores[0, 1, 2, 4] = float("nan")
    y = fusedsoftmax(scores, mask, 0.5, F32)
    stock = torch.softmax(scores * 0.5 + mask, -1)
    assert torch.equal(torch.isnan(y), torch.isnan(stock))
    _assert_matches(y, reference_fusedsoftmax(scores, mask, 0.5), TOL[F32])


def test_large_logits_do_not_overflow(impl):
    scores = _randn((2, 2, 4, 300), BF16, seed=3, scale=1e4)  # exp would overflow without the max shift
    y = fusedsoftmax(scores, _causal_mask(2, 4, 300), 1.0, F32)
    _assert_matches(y, reference_fusedsoftmax(scores, _causal_mask(2, 4, 300), 1.0), TOL[F32])


def test_deterministic(impl):
    scores, mask = _inputs((2, 3, 9, 9), "padding", BF16, F32, seed=4)
    assert torch.equal(fusedsoftmax(scores, mask, 0.25, BF16), fusedsoftmax(scores, mask, 0.25, BF16))


def test_impl_calls_count_only_what_ran(impl):
    other = {"cpu": "triton", "triton": "cpu"}[impl]
    before = IMPL_CALLS.copy()
    scores = _randn((1, 2, 3, 3), F32).requires_grad_()
    fusedsoftmax(scores, _causal_mask(1, 3, 3), 0.5).sum().backward()
    assert IMPL_CALLS[f"{impl}.fwd"] - before[f"{impl}.fwd"] == 1
    assert IMPL_CALLS[f"{impl}.bwd"] - before[f"{impl}.bwd"] == 1
    assert IMPL_CALLS[f"{other}.fwd"] == before[f"{other}.fwd"] and IMPL_CALLS[f"{other}.bwd"] == before[f"{other}.bwd"]


def test_gradcheck_fp64_scores_and_mask():
    scores = torch.randn(2, 2, 4, 4, dtype=F64, requires_grad=True)
    mask = (torch.randn(2, 1, 4, 4, dtype=F64) - torch.ones(4, 4, dtype=F64).triu(1) * 30).requires_grad_()
    assert torch.autograd.gradcheck(lambda s, m: fusedsoftmax(s, m, 0.7), (scores, mask))


def test_opcheck():
    g = torch.Generator().manual_seed(7)
    s = torch.randn(2, 3, 5, 5, generator=g, requires_grad=True)
    sb = torch.randn(2, 2, 1, 6, generator=g).to(BF16).requires_grad_()
    mask = _causal_mask(2, 5, 5)
    for args in [(s, mask, 0.5, F32), (s, None, 1.0, F32), (sb, _causal_mask(2, 1, 6), 0.125, BF16)]:
        torch.library.opcheck(torch.ops.e2eprof.fusedsoftmax.default, args)
    y = torch.softmax(torch.randn(2, 3, 5, 5, generator=g), -1)
    dy = torch.randn(2, 3, 5, 5, generator=g)
    torch.library.opcheck(torch.ops.e2eprof.fusedsoftmax_backward.default, (dy, y, 0.5, BF16))


def test_bad_inputs_raise():
    s = torch.randn(2, 2, 3, 3)
    with pytest.raises(ValueError, match="does not broadcast"):
        fusedsoftmax(s, torch.zeros(4, 1, 3, 3))  # would broadcast the scores to a bigger tensor
    with pytest.raises(TypeError, match="mask"):
        fusedsoftmax(s, torch.ones(2, 1, 3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(B, H, T, S\)"):
        fusedsoftmax(torch.randn(3, 3))


def test_cuda_without_triton_raises_instead_of_falling_back(monkeypatch):
    monkeypatch.setattr(fs_op, "TRITON_AVAILABLE", False)
    fake_cuda = types.SimpleNamespace(is_cuda=True, device=torch.device("cuda"))  # no GPU needed to reach the check
    with pytest.raises(RuntimeError, match="refusing to fall back"):
        fs_op._choose_impl(fake_cuda)


def test_bad_impl_switch_raises(monkeypatch):
    monkeypatch.setenv(fs_op.IMPL_ENV, "torch")
    with pytest.raises(ValueError, match=fs_op.IMPL_ENV):
        fusedsoftmax(torch.randn(1, 1, 2, 2))


# --- the replaced function against the stock one -----------------------------------------------------------------


def _qkv(B=2, H=3, T=6, D=8, seed=5):
    return [_randn((B, H, T, D), F32, seed + i) for i in range(3)]


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "autocast-bf16"])
def test_replacement_matches_stock_dtypes_and_values(impl, autocast):
    module = types.SimpleNamespace(training=False)
    q, k, v = _qkv()
    mask = _causal_mask(2, 6, 6, pad=[0, 2])
    with torch.autocast("cpu", dtype=BF16, enabled=autocast):
        stock = STOCK_EAGER(module, q, k, v, mask, scaling=0.35)
        got = fused_eager_attention_forward(module, q, k, v, mask, scaling=0.35)
    ref = eager_attention_reference(module, q.double(), k.double(), v.double(), mask.double(), scaling=0.35)
    for name, g, s, r in zip(("attn_output", "attn_weights"), got, stock, ref):
        assert (g.dtype, g.shape, g.stride()) == (s.dtype, s.shape, s.stride()), name
        stock_err = ((s.double() - r).norm() / r.norm()).item()
        err = ((g.double() - r).norm() / r.norm()).item()
        assert err <= max(2 * stock_err, TOL[g.dtype]), f"{name}: {err:.3g} vs stock {stock_err:.3g}"


def test_replacement_defaults_scaling_and_takes_no_mask_like_stock():
    module = types.SimpleNamespace(training=False)
    q, k, v = _qkv(seed=8)
    for got, stock in zip(fused_eager_attention_forward(module, q, k, v, None),
                          STOCK_EAGER(module, q, k, v, None)):
        torch.testing.assert_close(got, stock, rtol=1e-5, atol=1e-6)


def test_dropout_draws_the_same_mask_as_stock():
    module = types.SimpleNamespace(training=True)
    q, k, v = _qkv(seed=11)
    mask = _causal_mask(2, 6, 6)
    torch.manual_seed(123)
    stock = STOCK_EAGER(module, q, k, v, mask, scaling=0.35, dropout=0.5)
    torch.manual_seed(123)
    got = fused_eager_attention_forward(module, q, k, v, mask, scaling=0.35, dropout=0.5)
    dropped = stock[1] == 0
    assert dropped.float().mean() > 0.3  # dropout did act (beyond the causal zeros)
    assert torch.equal(got[1] == 0, dropped)
    torch.testing.assert_close(got[1], stock[1], rtol=1e-5, atol=1e-6)


# --- the patch on a real tiny GPT-2 ------------------------------------------------------------------------------


@pytest.fixture
def model():
    return build_model(resolve_model("gpt2-tiny"), attn_implementation="eager", seed=0)


@pytest.fixture
def input_ids():
    return torch.randint(0, 512, (2, 13), generator=torch.Generator().manual_seed(0))  # odd T


def _padding_mask():
    mask = torch.ones(2, 13, dtype=torch.long)
    mask[1, :4] = 0  # left padding in the second sequence
    return mask


def test_patch_sites_calls_outputs_and_revert(impl, model, input_ids):
    with torch.no_grad():
        expected = model(input_ids, attention_mask=_padding_mask()).logits
    layers = model.config.n_layer
    before = IMPL_CALLS.copy()
    applied = apply_patch(PATCH, model)
    try:
        assert applied.sites == [{"target": "transformers.models.gpt2.modeling_gpt2:eager_attention_forward",
                                  "kind": "function", "count": 1}]
        assert modeling_gpt2.eager_attention_forward is not STOCK_EAGER
        with torch.no_grad():
            got = model(input_ids, attention_mask=_padding_mask()).logits
        assert applied.calls == layers
        assert IMPL_CALLS[f"{impl}.fwd"] - before[f"{impl}.fwd"] == layers
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)
    finally:
        applied.revert()
    assert modeling_gpt2.eager_attention_forward is STOCK_EAGER
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids, attention_mask=_padding_mask()).logits, expected, rtol=0, atol=0)


def test_patch_training_gradients_match_stock(impl, model, input_ids):
    def grads():
        model.zero_grad(set_to_none=True)
        model(input_ids, labels=input_ids).loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters()}

    expected = grads()
    before = IMPL_CALLS.copy()
    applied = apply_patch(PATCH, model)
    try:
        got = grads()
    finally:
        applied.revert()
    assert IMPL_CALLS[f"{impl}.bwd"] - before[f"{impl}.bwd"] == model.config.n_layer
    for name, grad in expected.items():
        err = ((got[name] - grad).norm() / grad.norm()).item()
        assert err < 1e-4, f"{name}: relative-norm error {err:.3g}"


def test_patch_train_mode_with_dropout_matches_stock(model, input_ids):
    assert model.config.attn_pdrop > 0  # the preset keeps GPT-2's dropout, so the train loop draws masks
    model.train()
    torch.manual_seed(7)
    expected = model(input_ids).logits
    applied = apply_patch(PATCH, model)
    try:
        torch.manual_seed(7)
        got = model(input_ids).logits
    finally:
        applied.revert()
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)


def test_patch_verify_mode_passes(model, input_ids):
    applied = apply_patch(PATCH, model)
    try:
        applied.set_verify(True)
        with torch.no_grad():
            model(input_ids)
        checks = applied.checks()
    finally:
        applied.revert()
    assert checks and all(c.passed for c in checks), [c.problems for c in checks]


def test_patch_refuses_sdpa_models():
    sdpa = build_model(resolve_model("gpt2-tiny"), attn_implementation="sdpa", seed=0)
    with pytest.raises(PatchError, match="eager"):
        apply_patch(PATCH, sdpa)
    assert modeling_gpt2.eager_attention_forward is STOCK_EAGER
