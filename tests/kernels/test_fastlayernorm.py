"""Correctness of e2eprof.kernels.fastlayernorm on CPU: the CPU implementation and the Triton kernels (interpreter),
and the fastlayernorm patch on a real (tiny, random-weight) GPT-2.

Every check compares against an fp64 reference with a relative-norm error (||out - ref|| / ||ref||) and requires NaN
positions to match exactly: allclose-style checks pass zeros or NaN, which is what these tests must catch.
"""

import os

import pytest
import torch
import torch.nn.functional as F
from transformers.models.bert import modeling_bert
from transformers.models.gpt2 import modeling_gpt2

from e2eprof.errors import PatchError
from e2eprof.kernels.fastlayernorm import IMPL_CALLS, TRITON_AVAILABLE, fastlayernorm, reference_layer_norm
from e2eprof.kernels.fastlayernorm import op as fl_op
from e2eprof.kernels.fastlayernorm import triton_kernels as fl_triton
from e2eprof.kernels.fastlayernorm.patch import PATCH, FastLayerNorm, layer_norm_like_torch
from e2eprof.patching import apply_patch
from e2eprof.workloads.models import build_model, resolve_model

F64, F32, BF16, F16 = torch.float64, torch.float32, torch.bfloat16, torch.float16

# Relative-norm tolerance by output dtype: a few units of the dtype's rounding (bf16 2^-8, fp16 2^-11, fp32 2^-24).
TOL = {F64: 1e-12, F32: 1e-5, BF16: 1e-2, F16: 2e-3}

# (x dtype, parameter dtype, output dtype). CPU accepts reduced-precision x with fp32 parameters (mixed dtype), and
# autocast-style fp32 output from bf16 input is what the kernel must support on CUDA.
DTYPES = [(F32, F32, F32), (BF16, BF16, BF16), (BF16, F32, BF16), (BF16, F32, F32), (F16, F16, F16), (F64, F64, F64)]

STOCK_NN = torch.nn
STOCK_LAYER_NORM = torch.nn.LayerNorm

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
IMPLS = [
    "cpu",
    pytest.param(
        "triton",
        marks=pytest.mark.skipif(not (TRITON_AVAILABLE and _INTERPRET), reason="needs triton and TRITON_INTERPRET=1"),
    ),
]

LONG_FWD = fl_triton.MAX_FUSED_COLS_FWD + 808  # above both fused limits: both looped kernels, a ragged last tile
LONG_BWD = fl_triton.MAX_FUSED_COLS_BWD + 904  # fused forward, looped backward
BWD_ROWS = fl_triton.BWD_PROGRAMS_INTERPRETER + 2  # more rows than backward programs: partials accumulate rows

# (id, x shape, normalized_shape, view): views make non-contiguous inputs.
SHAPES = [
    ("1x3", (1, 3), (3,), None),  # the shortest row whose dx is not zero (N = 2 gives xhat = -1, +1 whatever x)
    ("7", (7,), (7,), None),  # one row, no batch dims: mean and rstd are 0-d
    ("5x33", (5, 33), (33,), None),
    ("2x3x4x6-2d", (2, 3, 4, 6), (4, 6), None),  # normalized over two dims
    ("0x8", (0, 8), (8,), None),
    ("transposed", (8, 5), (8,), lambda t: t.t()),  # (5, 8) with strides (1, 5)
    ("sliced", (3, 20), (10,), lambda t: t[:, ::2]),  # (3, 10) with strides (20, 2)
    ("long-fwd", (2, LONG_FWD), (LONG_FWD,), None),
    ("long-bwd", (BWD_ROWS, LONG_BWD), (LONG_BWD,), None),
    ("many-rows", (37, 24), (24,), None),  # each backward program walks several rows
]
AFFINE = ["weight+bias", "weight-only", "none"]


def _cases():
    """(shape case, dtypes, affine): every affine variant in fp32 and mixed bf16/fp32 (the kernels' two code paths
    for parameters), the full affine case in the other dtypes; long rows (slow under the interpreter) once per dtype."""
    for shape_case in SHAPES:
        for dtypes in DTYPES:
            for affine in AFFINE:
                full = affine == "weight+bias"
                if shape_case[0].startswith("long") and (not full or dtypes[0] == F64):
                    continue
                if full or dtypes in ((F32, F32, F32), (BF16, F32, F32)):
                    ids = "-".join([shape_case[0], *(str(d).removeprefix("torch.") for d in dtypes), affine])
                    yield pytest.param(*shape_case, *dtypes, affine, id=ids)


@pytest.fixture(params=IMPLS)
def impl(request, monkeypatch):
    """Selects the implementation under test through the same env switch users have."""
    monkeypatch.setenv(fl_op.IMPL_ENV, request.param)
    return request.param


def _skip_unsupported(impl: str, *dtypes: torch.dtype) -> None:
    if impl == "triton" and F64 in dtypes:
        pytest.skip("the Triton kernels compute in fp32; fp64 is a CPU-only path")


def _randn(shape, dtype: torch.dtype, seed: int, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=F64) * scale + shift).to(dtype)


def _params(normalized_shape, dtype, affine: str):
    weight = _randn(normalized_shape, dtype, 11, scale=0.5, shift=1.0) if affine != "none" else None
    bias = _randn(normalized_shape, dtype, 12) if affine == "weight+bias" else None
    return weight, bias


def _assert_matches(out: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    """NaN positions equal, then relative-norm error over the non-NaN positions below tol."""
    assert type(out) is torch.Tensor  # a plain tensor, not a lazy subclass
    assert out.shape == ref.shape
    nan_out, nan_ref = torch.isnan(out), torch.isnan(ref)
    assert torch.equal(nan_out, nan_ref), f"NaN at {nan_out.sum()} positions, reference at {nan_ref.sum()}"
    keep = ~nan_ref
    diff = (out.double() - ref)[keep]
    den = ref[keep].norm()
    err = (diff.norm() / den).item() if den > 0 else diff.norm().item()
    assert err <= tol, f"relative-norm error {err:.3g} > {tol:g}"


def _leaves(*tensors):
    return [t.detach().requires_grad_() if t is not None else None for t in tensors]


def _fwd_bwd_against_reference(x_leaf, view, normalized_shape, weight, bias, eps, out_dtype, tol_fwd, tol_bwd):
    """Forward and backward (x, weight, bias) against fp64, both through `view` of the leaf x."""
    x = view(x_leaf) if view is not None else x_leaf
    y = fastlayernorm(x, normalized_shape, weight, bias, eps, out_dtype)
    assert y.dtype == out_dtype and y.is_contiguous() and y.shape == x.shape
    x64_leaf, w64, b64 = _leaves(*(None if t is None else t.detach().double() for t in (x_leaf, weight, bias)))
    x64 = view(x64_leaf) if view is not None else x64_leaf
    ref = reference_layer_norm(x64, normalized_shape, w64, b64, eps)
    _assert_matches(y, ref, tol_fwd)
    if y.numel() == 0:
        return
    dy = _randn(y.shape, out_dtype, seed=3)
    inputs = [t for t in (x_leaf, weight, bias) if t is not None]
    grads = torch.autograd.grad(y, inputs, dy)
    ref_grads = torch.autograd.grad(ref, [t for t in (x64_leaf, w64, b64) if t is not None], dy.double())
    for got, want, leaf in zip(grads, ref_grads, inputs):
        assert got.dtype == leaf.dtype and got.shape == leaf.shape
        _assert_matches(got, want, tol_bwd)


@pytest.mark.parametrize("name,shape,normalized_shape,view,x_dtype,p_dtype,out_dtype,affine", list(_cases()))
def test_forward_backward(impl, name, shape, normalized_shape, view, x_dtype, p_dtype, out_dtype, affine):
    _skip_unsupported(impl, x_dtype, p_dtype, out_dtype)
    x_leaf = _randn(shape, x_dtype, seed=0, scale=2.0, shift=0.5).requires_grad_()
    weight, bias = _leaves(*_params(normalized_shape, p_dtype, affine))
    before = x_leaf.detach().clone()
    fwd, bwd = IMPL_CALLS[f"{impl}.fwd"], IMPL_CALLS[f"{impl}.bwd"]
    # dx carries the rounding of dy (output dtype) and of dx itself (x dtype): the looser tolerance applies.
    tol_bwd = max(TOL[x_dtype], TOL[out_dtype], TOL[p_dtype])
    _fwd_bwd_against_reference(x_leaf, view, normalized_shape, weight, bias, 1e-5, out_dtype,
                               max(TOL[out_dtype], TOL[p_dtype]), tol_bwd)
    assert IMPL_CALLS[f"{impl}.fwd"] == fwd + 1
    assert IMPL_CALLS[f"{impl}.bwd"] == bwd + (1 if x_leaf.numel() else 0)
    assert torch.equal(x_leaf.detach(), before)  # inputs are not mutated


@pytest.mark.parametrize("x_dtype", [F32, BF16, F64], ids=["f32", "bf16", "f64"])
def test_one_element_rows_are_exact(impl, x_dtype):
    # N = 1: mean = x, xhat = 0, so y = bias, dx = 0, dweight = 0 and dbias = dy, exactly. (Compared exactly and not
    # against the fp64 reference, whose roundoff in these zeros would dominate any relative error.)
    _skip_unsupported(impl, x_dtype)
    x = _randn((5, 1), x_dtype, seed=1, scale=3.0).requires_grad_()
    weight, bias = _leaves(*_params((1,), x_dtype, "weight+bias"))
    y = fastlayernorm(x, 1, weight, bias)
    assert torch.equal(y, bias.detach().expand(5, 1))
    dy = _randn((5, 1), x_dtype, seed=2)
    dx, dweight, dbias = torch.autograd.grad(y, (x, weight, bias), dy)
    assert torch.equal(dx, torch.zeros_like(dx)) and torch.equal(dweight, torch.zeros_like(dweight))
    torch.testing.assert_close(dbias, dy.sum(0), rtol=TOL[x_dtype], atol=0)


def _relative_error(value: torch.Tensor, ref: torch.Tensor) -> float:
    return ((value.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("eps", [1e-5, 1e-2, 0.5])
def test_eps_and_low_variance_rows_as_accurate_as_stock(impl, eps):
    # Rows with std ~1e-2 around 10: eps ranges from negligible to dominant against the variance (1e-4), and the
    # mean is 1000x the spread. fp32 itself limits accuracy here (the mean's rounding is ~3e-5 of the spread), so
    # the yardstick is stock fp32 layer_norm's own error, as in e2eprof's gate; a one-pass E[x^2] - E[x]^2
    # variance would be off by orders of magnitude more.
    x = _randn((6, 40), F32, seed=4, scale=1e-2, shift=10.0)
    weight, bias = _params((40,), F32, "weight+bias")
    dy = _randn((6, 40), F32, seed=5)
    x64, w64, b64 = _leaves(x.double(), weight.double(), bias.double())
    ref = reference_layer_norm(x64, 40, w64, b64, eps)
    ref_grads = torch.autograd.grad(ref, (x64, w64, b64), dy.double())

    def errors(layer_norm):
        xs, ws, bs = _leaves(x, weight, bias)
        y = layer_norm(xs, (40,), ws, bs, eps)
        grads = torch.autograd.grad(y, (xs, ws, bs), dy)
        return [_relative_error(y, ref)] + [_relative_error(g, r) for g, r in zip(grads, ref_grads)]

    for ours, stock, floor in zip(errors(fastlayernorm), errors(F.layer_norm), [TOL[F32]] * 4):
        assert ours <= max(2 * stock, floor), (ours, stock)


@pytest.mark.parametrize("x_dtype", [F32, BF16, F16], ids=["f32", "bf16", "f16"])
def test_large_magnitudes(impl, x_dtype):
    scale, shift = (1e4, 3e4) if x_dtype != F16 else (1e3, 3e3)
    x = _randn((4, 300), x_dtype, seed=5, scale=scale, shift=shift).requires_grad_()
    weight, bias = _leaves(*_params((300,), F32 if x_dtype != F16 else F16, "weight+bias"))
    _fwd_bwd_against_reference(x, None, (300,), weight, bias, 1e-5, x_dtype, TOL[x_dtype], TOL[x_dtype])


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # interpreter: inf - inf in numpy
@pytest.mark.parametrize("cols", [24, LONG_FWD], ids=["row-kernel", "looped"])
def test_nan_and_inf_rows_like_the_stock_op(impl, cols):
    x = _randn((4, cols), F32, seed=6)
    x[1, cols // 2] = float("nan")
    x[2, cols - 1] = float("inf")
    weight, bias = _params((cols,), F32, "weight+bias")
    y = fastlayernorm(x, (cols,), weight, bias)
    stock = F.layer_norm(x, (cols,), weight, bias)
    assert torch.equal(torch.isnan(y), torch.isnan(stock))
    assert torch.isnan(y[1]).all() and torch.isnan(y[2]).all() and not torch.isnan(y[[0, 3]]).any()
    _assert_matches(y, reference_layer_norm(x, (cols,), weight, bias), TOL[F32])


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # interpreter: the plain sum overflows
@pytest.mark.parametrize("cols", [768, LONG_FWD], ids=["row-kernel", "looped"])
def test_rows_near_the_largest_float_stay_finite_like_the_stock_op(impl, cols):
    """Values a quarter of fp32's largest sum past it: torch's CUDA layer_norm keeps a running mean, which stays
    finite (its variance overflows, so its output is the bias), and the kernel must not give NaN there (the
    H200's bf16 stress points found that); torch's CPU layer_norm gives NaN. Rows of denormals next to them keep
    the plain sum's precision."""
    x = _randn((3, cols), F32, seed=9)
    x[0] = x[0].abs() * (torch.finfo(F32).max / 4 / x[0].abs().max())  # same sign: the plain sum overflows
    x[1] = x[1] * (torch.finfo(F32).tiny / 8)  # denormals
    weight, bias = _params((cols,), F32, "weight+bias")
    y = fastlayernorm(x, (cols,), weight, bias)
    stock = F.layer_norm(x, (cols,), weight, bias)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y[0], bias.expand(cols))  # the variance overflows: x * 0 + bias, as torch on CUDA
    if torch.isfinite(stock[0]).all():
        torch.testing.assert_close(y[0], stock[0])
    _assert_matches(y[1:], reference_layer_norm(x[1:], (cols,), weight, bias), TOL[F32])


def test_deterministic(impl):
    x = _randn((37, 100), BF16, seed=7).requires_grad_()
    weight, bias = _leaves(*_params((100,), F32, "weight+bias"))

    def run():
        y = fastlayernorm(x, (100,), weight, bias)
        return (y, *torch.autograd.grad(y, (x, weight, bias), torch.ones_like(y)))

    assert all(torch.equal(a, b) for a, b in zip(run(), run()))


def test_impl_calls_count_only_what_ran(impl):
    other = {"cpu": "triton", "triton": "cpu"}[impl]
    before = IMPL_CALLS.copy()
    x = _randn((3, 7), F32, seed=8).requires_grad_()
    fastlayernorm(x, 7).sum().backward()
    after = IMPL_CALLS
    assert after[f"{impl}.fwd"] - before[f"{impl}.fwd"] == 1
    assert after[f"{impl}.bwd"] - before[f"{impl}.bwd"] == 1
    assert after[f"{other}.fwd"] == before[f"{other}.fwd"] and after[f"{other}.bwd"] == before[f"{other}.bwd"]


def test_statistics_are_not_differentiable():
    x = _randn((3, 5), F32, seed=9).requires_grad_()
    y, mean, rstd = torch.ops.e2eprof.fastlayernorm(x, [5], None, None, 1e-5, None)
    assert y.requires_grad and not mean.requires_grad and not rstd.requires_grad
    torch.testing.assert_close(mean, x.detach().mean(-1))
    torch.testing.assert_close(rstd, (x.detach().var(-1, unbiased=False) + 1e-5).rsqrt())


def test_opcheck(impl):
    # Under both implementations: the Triton route returns its launcher's outputs without a reshape, and the fake
    # kernel's shapes and strides must still be what it returns.
    g = torch.Generator().manual_seed(10)
    x = torch.randn(3, 5, 7, generator=g, requires_grad=True)
    w = torch.randn(7, generator=g, requires_grad=True)
    b = torch.randn(7, generator=g, requires_grad=True)
    xb = torch.randn(4, 9, generator=g).to(BF16).requires_grad_()
    xt = torch.randn(7, 5, generator=g).t().requires_grad_()  # non-contiguous
    for args in [(x, [7], w, b, 1e-5, None), (x, [5, 7], None, None, 1e-3, None), (x, [7], w, None, 1e-5, BF16),
                 (xb, [9], None, None, 1e-5, F32), (xt, [7], w, b, 1e-5, None)]:
        torch.library.opcheck(torch.ops.e2eprof.fastlayernorm.default, args)
    y, mean, rstd = torch.ops.e2eprof.fastlayernorm(x.detach(), [7], w.detach(), None, 1e-5, None)
    torch.library.opcheck(torch.ops.e2eprof.fastlayernorm_backward.default,
                          (torch.randn_like(y), x.detach(), mean, rstd, [7], w.detach(), F32, F32, BF16))


def test_gradcheck_fp64():
    x = torch.randn(4, 6, dtype=F64, requires_grad=True)
    w = torch.randn(6, dtype=F64, requires_grad=True)
    b = torch.randn(6, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: fastlayernorm(x, 6, w, b, 1e-3), (x, w, b))


def test_rejects_bad_shapes_and_dtypes():
    x = torch.randn(3, 5)
    with pytest.raises(ValueError, match="normalized_shape"):
        fastlayernorm(x, 4)
    with pytest.raises(ValueError, match="weight shape"):
        fastlayernorm(x, 5, torch.ones(4))
    with pytest.raises(TypeError):
        fastlayernorm(torch.ones(3, 5, dtype=torch.int64), 5)
    with pytest.raises(TypeError):
        fastlayernorm(x, 5, out_dtype=torch.int32)





@pytest.mark.parametrize("x_dtype,p_dtype", [(F32, F32), (BF16, F32), (BF16, BF16)], ids=["f32", "bf16-f32", "bf16"])
@pytest.mark.parametrize("autocast", [False, True], ids=["plain", "autocast-bf16"])
def test_output_dtype_follows_the_stock_op(x_dtype, p_dtype, autocast):
    x = _randn((2, 8), x_dtype, seed=13)
    weight, bias = _params((8,), p_dtype, "weight+bias")
    with torch.autocast("cpu", dtype=BF16, enabled=autocast):
        assert layer_norm_like_torch(x, (8,), weight, bias).dtype == F.layer_norm(x, (8,), weight, bias).dtype


def test_dtype_combination_the_stock_op_rejects_is_rejected():
    # CPU layer_norm refuses fp32 input with bf16 parameters; computing it anyway would hide a model bug.
    with pytest.raises(RuntimeError, match="mixed dtype"):
        layer_norm_like_torch(torch.randn(2, 8), (8,), torch.ones(8, dtype=BF16), None)


# --- the patch on real tiny GPT-2 and BERT models --------------------------------------------------------------

GPT2_TARGET = "transformers.models.gpt2.modeling_gpt2:nn.LayerNorm"
BERT_TARGET = "transformers.models.bert.modeling_bert:nn.LayerNorm"


@pytest.fixture
def model():
    return build_model(resolve_model("gpt2-tiny"), attn_implementation="eager", seed=0)


@pytest.fixture
def input_ids():
    return torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))


def _layer_norms(model):
    return [m for m in model.modules() if isinstance(m, STOCK_LAYER_NORM)]


def _assert_reverted(model) -> None:
    assert modeling_gpt2.nn is STOCK_NN and modeling_bert.nn is STOCK_NN and torch.nn.LayerNorm is STOCK_LAYER_NORM
    norms = _layer_norms(model)
    assert norms and all(type(m) is STOCK_LAYER_NORM and "forward" not in vars(m) for m in norms)


def test_patch_on_gpt2(impl, model, input_ids, check_patch_on_model):
    # ln_1 and ln_2 per block, ln_f; counted under GPT-2's own target, BERT's counts zero.
    sites = 2 * model.config.n_layer + 1
    check_patch_on_model(PATCH, model, input_ids, impl=impl, impl_calls=IMPL_CALLS,
                         sites={GPT2_TARGET: sites, BERT_TARGET: 0})
    _assert_reverted(model)


def test_patch_on_bert(impl, check_patch_on_model):
    bert = build_model(resolve_model("bert-tiny"), attn_implementation="sdpa", seed=0)
    # Embeddings, then attention output and FFN output per layer, then the MLM head's transform.
    sites = 2 * bert.config.num_hidden_layers + 2
    assert len(_layer_norms(bert)) == sites
    ids = torch.randint(0, bert.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    check_patch_on_model(PATCH, bert, ids, impl=impl, impl_calls=IMPL_CALLS, sites={BERT_TARGET: sites, GPT2_TARGET: 0})
    _assert_reverted(bert)


def test_patch_is_scoped_to_the_modeling_modules(model):
    applied = apply_patch(PATCH, model)
    try:
        # Only GPT-2's and BERT's modeling modules see the subclass; torch.nn.LayerNorm stays stock for the process.
        assert modeling_gpt2.nn.LayerNorm is FastLayerNorm and modeling_bert.nn.LayerNorm is FastLayerNorm
        assert torch.nn.LayerNorm is STOCK_LAYER_NORM
        assert all(type(m) is FastLayerNorm for m in _layer_norms(model))
    finally:
        applied.revert()
    _assert_reverted(model)


def test_patch_verify_mode_passes(model, input_ids):
    applied = apply_patch(PATCH, model)
    try:
        applied.set_verify(True)
        with torch.no_grad():
            model(input_ids)
        checks = applied.checks()
    finally:
        applied.revert()
    assert len(checks) == 1 and checks[0].calls == 2 * model.config.n_layer + 1
    assert checks[0].passed, checks[0].problems
    assert 0 < checks[0].stock_error < 1e-6  # stock fp32 layer_norm against the fp64 reference


def test_patch_without_a_model_is_refused():
    with pytest.raises(PatchError, match="zero sites"):
        apply_patch(PATCH)
    assert modeling_gpt2.nn is STOCK_NN
