"""Correctness of e2eprof.kernels.rmsnorm on CPU (CPU implementation and Triton kernels under the interpreter), and of
the rmsnorm patch on a llama-tiny model.

Every check compares against an fp64 reference with a relative-norm error and requires NaN positions to match: an
allclose-style check would pass zeros or NaN, which is what these tests must catch.
"""

import os

import pytest
import torch
from transformers.models.llama import modeling_llama

from e2eprof.errors import PatchError
from e2eprof.kernels.rmsnorm import IMPL_CALLS, TRITON_AVAILABLE, reference_rmsnorm, rmsnorm
from e2eprof.kernels.rmsnorm import op as rms_op
from e2eprof.kernels.rmsnorm.patch import PATCH, FusedLlamaRMSNorm
from e2eprof.patching import apply_patch
from e2eprof.workloads.models import build_model, resolve_model

F64, F32, BF16, F16 = torch.float64, torch.float32, torch.bfloat16, torch.float16

# Relative-norm tolerance by dtype: a few roundings of the dtype (bf16 2^-8, fp16 2^-11, fp32 2^-24) over a row.
# The interpreter truncates fp32->bf16 instead of rounding (up to 2^-8), still inside 1e-2.
TOL = {F64: 1e-12, F32: 1e-5, BF16: 1e-2, F16: 2e-3}

# (x dtype, weight dtype): what LlamaRMSNorm meets: fp32 residual stream with fp32 weights (autocast leaves the norm
# alone), bf16/fp16 models, and mixed cases whose output is promoted.
DTYPES = [(F32, F32), (BF16, F32), (BF16, BF16), (F16, F16), (F16, F32), (F64, F64)]

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
IMPLS = [
    "cpu",
    pytest.param(
        "triton",
        marks=pytest.mark.skipif(not (TRITON_AVAILABLE and _INTERPRET), reason="needs triton and TRITON_INTERPRET=1"),
    ),
]

# (id, shape, transpose): transpose makes a non-contiguous input by swapping the last two dims of shape.
SHAPES = [
    ("1x1", (1, 1), False),
    ("single-row-257", (1, 257), False),
    ("3x7", (3, 7), False),
    ("5x1000", (5, 1000), False),
    ("19x64-many-rows", (19, 64), False),  # more rows than backward programs: each program loops over several
    ("2x3x5x9", (2, 3, 5, 9), False),
    ("transposed", (9, 5), True),  # (5, 9) with strides (1, 5)
    ("0x5", (0, 5), False),
]


@pytest.fixture(params=IMPLS)
def impl(request, monkeypatch):
    """Selects the implementation under test through the same env switch users have."""
    monkeypatch.setenv(rms_op.IMPL_ENV, request.param)
    return request.param


def _skip_unsupported(impl, *dtypes):
    if impl == "triton" and F64 in dtypes:
        pytest.skip("the Triton kernels compute in fp32; fp64 is a CPU-only path")


def _make(shape, dtype, seed=0, scale=1.0, transpose=False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g, dtype=F64) * scale).to(dtype)
    return x.transpose(-1, -2) if transpose else x


def _weight(cols, dtype, seed=1) -> torch.Tensor:
    # Around 1 like a trained norm, but not all ones: a kernel that ignored the weight must fail.
    return (1 + 0.5 * _make((cols,), F64, seed=seed)).to(dtype)


def _rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative-norm error over the reference's non-NaN positions (absolute when the reference is all zeros)."""
    keep = ~torch.isnan(ref)
    diff = (out.double() - ref.double())[keep]
    den = ref.double()[keep].norm()
    return (diff.norm() / den).item() if den > 0 else diff.norm().item()


def _assert_matches(out: torch.Tensor, ref: torch.Tensor, tol: float, stock: torch.Tensor | None = None) -> None:
    """Plain tensor, same shape, NaN positions equal, relative-norm error at most tol, or at most twice the stock
    path's own error when that is larger (ill-conditioned cases, e.g. a 1-column row's gradient, which is ~eps)."""
    assert type(out) is torch.Tensor
    assert out.shape == ref.shape
    nan_out, nan_ref = torch.isnan(out), torch.isnan(ref)
    assert torch.equal(nan_out, nan_ref), f"NaN at {nan_out.sum()} positions, reference at {nan_ref.sum()}"
    err = _rel_error(out, ref)
    allowed = max(tol, 2 * _rel_error(stock, ref)) if stock is not None else tol
    assert err <= allowed, f"relative-norm error {err:.3g} > {allowed:g}"


def _stock(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The stock module's forward on these tensors (the exact numerics the kernel must reproduce)."""
    norm = modeling_llama.LlamaRMSNorm(weight.shape[0], eps=eps)
    norm.weight = torch.nn.Parameter(weight.detach().clone(), requires_grad=False)
    with torch.no_grad():
        return norm(x)


def _stock_grads(x: torch.Tensor, weight: torch.Tensor, eps: float, dy: torch.Tensor):
    """(dx, dweight) of the stock module: the yardstick for how well-conditioned a gradient is."""
    norm = modeling_llama.LlamaRMSNorm(weight.shape[0], eps=eps)
    norm.weight = torch.nn.Parameter(weight.detach().clone())
    xs = x.detach().clone().requires_grad_()
    return torch.autograd.grad(norm(xs), (xs, norm.weight), dy)


ids = lambda d: str(d).replace("torch.", "")  # noqa: E731


@pytest.mark.parametrize("x_dtype,w_dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("name,shape,transpose", SHAPES, ids=[s[0] for s in SHAPES])
def test_forward(impl, name, shape, transpose, x_dtype, w_dtype):
    _skip_unsupported(impl, x_dtype, w_dtype)
    x = _make(shape, x_dtype, transpose=transpose)
    w = _weight(x.shape[-1], w_dtype)
    x_before, w_before = x.clone(), w.clone()
    calls = IMPL_CALLS[f"{impl}.fwd"]
    y = rmsnorm(x, w, 1e-6)
    assert IMPL_CALLS[f"{impl}.fwd"] == calls + 1
    assert torch.equal(x, x_before) and torch.equal(w, w_before)  # inputs are not mutated
    stock = _stock(x, w, 1e-6)
    assert y.dtype == stock.dtype == torch.promote_types(x_dtype, w_dtype)
    assert y.shape == x.shape and y.is_contiguous()
    # The normalised row is rounded to x's dtype before the weight multiply, so x's precision bounds the error too.
    tol = max(TOL[x_dtype], TOL[y.dtype])
    _assert_matches(y, reference_rmsnorm(x, w, 1e-6), tol)
    # Same rounding steps as the stock module (fp32 math, normalised row rounded to x's dtype): only reduction order
    # may differ. The stock module computes fp64 inputs in fp32 too (our CPU path keeps fp64), hence the fp32 floor.
    _assert_matches(y, stock, max(tol, TOL[F32]))


@pytest.mark.parametrize("x_dtype,w_dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("name,shape,transpose", SHAPES, ids=[s[0] for s in SHAPES])
def test_backward(impl, name, shape, transpose, x_dtype, w_dtype):
    _skip_unsupported(impl, x_dtype, w_dtype)
    x = _make(shape, x_dtype, transpose=transpose).requires_grad_()
    w = _weight(x.shape[-1], w_dtype).requires_grad_()
    y = rmsnorm(x, w, 1e-6)
    dy = _make(y.shape, y.dtype, seed=2)
    calls = IMPL_CALLS[f"{impl}.bwd"]
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    assert IMPL_CALLS[f"{impl}.bwd"] == calls + 1
    assert dx.dtype == x_dtype and dx.shape == x.shape
    assert dw.dtype == w_dtype and dw.shape == w.shape
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    dx_ref, dw_ref = torch.autograd.grad(reference_rmsnorm(x64, w64, 1e-6), (x64, w64), dy.double())
    dx_stock, dw_stock = _stock_grads(x, w, 1e-6, dy)
    # Gradients carry the rounding of y (output dtype) and their own dtype's: the looser tolerance applies.
    loose = max(TOL[x_dtype], TOL[w_dtype], TOL[y.dtype])
    _assert_matches(dx, dx_ref, loose, stock=dx_stock)
    if x.numel():
        _assert_matches(dw, dw_ref, loose, stock=dw_stock)
    else:
        assert torch.equal(dw, torch.zeros_like(dw))  # no rows: nothing to accumulate


@pytest.mark.parametrize("scale", [1e4, 1e-3], ids=["large", "small"])
@pytest.mark.parametrize("x_dtype,w_dtype", DTYPES, ids=ids)
def test_magnitudes(impl, scale, x_dtype, w_dtype):
    # Large: x^2 sums to ~1e10, fine in fp32; fp16 inputs stay finite (6e4 max). Small: eps dominates mean(x^2).
    _skip_unsupported(impl, x_dtype, w_dtype)
    x = _make((4, 300), F64, seed=3, scale=scale).clamp(-6e4, 6e4).to(x_dtype).requires_grad_()
    w = _weight(300, w_dtype).requires_grad_()
    eps = 1e-5
    y = rmsnorm(x, w, eps)
    _assert_matches(y, reference_rmsnorm(x, w, eps), max(TOL[x_dtype], TOL[y.dtype]))
    dy = _make(y.shape, y.dtype, seed=4)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    dx_ref, dw_ref = torch.autograd.grad(reference_rmsnorm(x64, w64, eps), (x64, w64), dy.double())
    loose = max(TOL[x_dtype], TOL[w_dtype], TOL[y.dtype])
    _assert_matches(dx, dx_ref, loose)
    _assert_matches(dw, dw_ref, loose)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # interpreter computes NaN in numpy
def test_nan_stays_in_its_row_like_stock(impl):
    x = _make((4, 33), F32, seed=5)
    x[1, 7] = float("nan")
    w = _weight(33, F32)
    y = rmsnorm(x, w, 1e-6)
    stock = _stock(x, w, 1e-6)
    assert torch.equal(torch.isnan(y), torch.isnan(stock))
    assert torch.isnan(y[1]).all() and not torch.isnan(y[[0, 2, 3]]).any()


def test_deterministic(impl):
    x = _make((6, 100), BF16, seed=6)
    w = _weight(100, F32)
    assert torch.equal(rmsnorm(x, w, 1e-6), rmsnorm(x, w, 1e-6))


def test_impl_calls_count_only_what_ran(impl):
    other = {"cpu": "triton", "triton": "cpu"}[impl]
    before = IMPL_CALLS.copy()
    x = _make((3, 7), F32).requires_grad_()
    rmsnorm(x, _weight(7, F32), 1e-6).sum().backward()
    assert IMPL_CALLS[f"{impl}.fwd"] - before[f"{impl}.fwd"] == 1
    assert IMPL_CALLS[f"{impl}.bwd"] - before[f"{impl}.bwd"] == 1
    assert IMPL_CALLS[f"{other}.fwd"] == before[f"{other}.fwd"] and IMPL_CALLS[f"{other}.bwd"] == before[f"{other}.bwd"]


def test_opcheck():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(3, 5, 8, generator=g, requires_grad=True)
    w = torch.randn(8, generator=g, requires_grad=True)
    xb = torch.randn(4, 8, generator=g).to(BF16).requires_grad_()
    for args in [(x, w, 1e-6), (xb, w, 1e-5), (xb, w.detach().to(BF16).requires_grad_(), 1e-6)]:
        torch.library.opcheck(torch.ops.e2eprof.rmsnorm.default, args)
    dy = torch.randn(3, 5, 8, generator=g)
    torch.library.opcheck(torch.ops.e2eprof.rmsnorm_backward.default, (dy, x.detach(), w.detach(), 1e-6))


def test_gradcheck_fp64():
    x = torch.randn(3, 6, dtype=F64, requires_grad=True)
    w = torch.randn(6, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: rmsnorm(a, b, 1e-6), (x, w))




def test_bad_arguments():
    with pytest.raises(ValueError, match="weight"):
        rmsnorm(torch.randn(2, 3), torch.ones(4), 1e-6)
    with pytest.raises(TypeError):
        rmsnorm(torch.ones(2, 3, dtype=torch.int64), torch.ones(3), 1e-6)


# --- the patch on a real model ---


@pytest.fixture(scope="module")
def llama():
    return build_model(resolve_model("llama-tiny"), attn_implementation="eager", seed=0)


@pytest.mark.parametrize("patch_impl", IMPLS)
def test_patch_on_llama_tiny(llama, patch_impl, monkeypatch, check_patch_on_model):
    monkeypatch.setenv(rms_op.IMPL_ENV, patch_impl)
    ids = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(8))
    norms = [m for m in llama.modules() if type(m) is modeling_llama.LlamaRMSNorm]
    assert len(norms) == 2 * llama.config.num_hidden_layers + 1  # two per layer and the final norm
    check_patch_on_model(PATCH, llama, ids, impl=patch_impl, impl_calls=IMPL_CALLS, sites={PATCH.targets[0]: 5})
    assert modeling_llama.LlamaRMSNorm is not FusedLlamaRMSNorm


def test_patch_refuses_gpt2_and_names_what_it_is():
    gpt2 = build_model(resolve_model("gpt2-tiny"), attn_implementation="eager", seed=0)
    with pytest.raises(PatchError, match="applies to llama") as info:
        apply_patch(PATCH, gpt2)
    assert "'gpt2'" in str(info.value)
    assert not any(type(m) is FusedLlamaRMSNorm for m in gpt2.modules())


def test_passthrough_counts_stock_norms_without_replacing_them(llama):
    # What a stock arm's profiling phase installs: the replaced region is measured in every arm.
    ids = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        expected = llama(input_ids=ids).logits
    before = IMPL_CALLS.copy()
    applied = apply_patch(PATCH, llama, passthrough=True)
    try:
        with torch.no_grad():
            logits = llama(input_ids=ids).logits
        assert applied.calls == 5 and applied.n_sites == 5
        assert not any(type(m) is FusedLlamaRMSNorm for m in llama.modules())
        assert modeling_llama.LlamaRMSNorm is not FusedLlamaRMSNorm
    finally:
        applied.revert()
    assert IMPL_CALLS == before  # the kernel never ran
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)
    assert not any("forward" in vars(m) for m in llama.modules())
