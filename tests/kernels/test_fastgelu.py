"""Correctness of e2eprof.kernels.fastgelu on CPU: the CPU implementation and the Triton kernels (interpreter), and
the fastgelu patch on a real (tiny, random-weight) GPT-2.

Every check compares against an fp64 reference with a relative-norm error (||out - ref|| / ||ref||) and requires NaN
positions to match exactly: allclose-style checks pass zeros or NaN, which is what these tests must catch.
"""

import os

import pytest
import torch
from transformers import activations
from transformers.models.gpt2 import modeling_gpt2

from e2eprof.errors import PatchError
from e2eprof.kernels.fastgelu import IMPL_CALLS, TRITON_AVAILABLE, fastgelu, reference_gelu
from e2eprof.kernels.fastgelu import op as fg_op
from e2eprof.kernels.fastgelu.patch import PATCH, FastNewGELU, gelu_like_transformers
from e2eprof.patching import apply_patch
from e2eprof.workloads.models import build_model, resolve_model

F64, F32, BF16, F16 = torch.float64, torch.float32, torch.bfloat16, torch.float16

# Relative-norm tolerance by output dtype: a few units of the dtype's rounding (bf16 2^-8, fp16 2^-11, fp32 2^-24).
TOL = {F64: 1e-12, F32: 1e-5, BF16: 1e-2, F16: 2e-3}

DTYPE_PAIRS = [(F32, F32), (BF16, BF16), (BF16, F32), (F16, F16), (F32, BF16), (F64, F64)]  # (input, output)

# Captured at import, before any test patches anything: the genuine objects.
STOCK_GELU = activations.NewGELUActivation
STOCK_NN = torch.nn

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
IMPLS = [
    "cpu",
    pytest.param(
        "triton",
        marks=pytest.mark.skipif(not (TRITON_AVAILABLE and _INTERPRET), reason="needs triton and TRITON_INTERPRET=1"),
    ),
]


def _transposed(shape):
    return lambda t: t.reshape(shape[::-1]).transpose(0, 1)


# (id, shape of the source tensor, view applied to it): views make non-contiguous inputs, dense and not.
SHAPES = [
    ("scalar", (), None),
    ("1", (1,), None),
    ("7", (7,), None),
    ("0", (0,), None),
    ("4x0", (4, 0), None),
    ("3x5", (3, 5), None),
    ("2x3x1025", (2, 3, 1025), None),  # crosses a program boundary (1024 elements) with a ragged tail
    ("transposed", (6, 5), _transposed((6, 5))),  # dense, strides (1, 6): the output keeps them
    ("sliced", (4, 12), lambda t: t[:, ::2]),  # not dense: the output is a fresh dense layout
    ("permuted-sliced", (6, 4, 8), lambda t: t.transpose(0, 1)[:, :, ::2]),
    ("expanded", (1, 9), lambda t: t.expand(3, 9)),  # stride 0
    ("odd-size1-stride", (3, 1, 4), lambda t: t.as_strided((3, 1, 4), (4, 99, 1))),  # contiguous, yet restrided
]


@pytest.fixture(params=IMPLS)
def impl(request, monkeypatch):
    """Selects the implementation under test through the same env switch users have."""
    monkeypatch.setenv(fg_op.IMPL_ENV, request.param)
    return request.param


def _skip_unsupported(impl: str, *dtypes: torch.dtype) -> None:
    if impl == "triton" and F64 in dtypes:
        pytest.skip("the Triton kernels compute in fp32; fp64 is a CPU-only path")


def _make(shape, dtype: torch.dtype, seed: int = 0, scale: float = 3.0, view=None) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=F64) * scale
    if dtype == F16:
        x = x.clamp(-6e4, 6e4)  # stay finite in fp16 for the large-magnitude case
    x = x.to(dtype)
    return view(x) if view is not None else x


def _stock(x: torch.Tensor) -> torch.Tensor:
    return STOCK_GELU.forward(STOCK_GELU(), x)


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


def test_reference_is_the_transformers_formula():
    # The yardstick (torch's tanh GELU) and the replaced chain (transformers' gelu_new) agree in fp64.
    x = _make((1000,), F64, scale=4.0)
    torch.testing.assert_close(reference_gelu(x), _stock(x), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("name,shape,view", SHAPES, ids=[s[0] for s in SHAPES])
def test_forward(impl, name, shape, view, in_dtype, out_dtype):
    _skip_unsupported(impl, in_dtype, out_dtype)
    x = _make(shape, in_dtype, view=view)
    x_before = x.clone()
    calls = IMPL_CALLS[f"{impl}.fwd"]
    y = fastgelu(x, out_dtype)
    assert IMPL_CALLS[f"{impl}.fwd"] == calls + 1
    assert y.dtype == out_dtype
    assert y.stride() == _stock(x).stride()  # e2eprof's op check compares strides with the stock output
    assert torch.equal(x, x_before)  # inputs are not mutated
    _assert_matches(y, reference_gelu(x), TOL[out_dtype])


@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("name,shape,view", SHAPES, ids=[s[0] for s in SHAPES])
def test_backward(impl, name, shape, view, in_dtype, out_dtype):
    _skip_unsupported(impl, in_dtype, out_dtype)
    leaf = _make(shape, in_dtype).requires_grad_()
    x = view(leaf) if view is not None else leaf
    y = fastgelu(x, out_dtype)
    dy = _make(y.shape, out_dtype, seed=1, scale=1.0)
    calls = IMPL_CALLS[f"{impl}.bwd"]
    (dx,) = torch.autograd.grad(y, leaf, dy)
    assert IMPL_CALLS[f"{impl}.bwd"] == calls + 1
    assert dx.dtype == in_dtype and dx.shape == leaf.shape
    leaf64 = leaf.detach().double().requires_grad_()
    x64 = view(leaf64) if view is not None else leaf64
    (dx_ref,) = torch.autograd.grad(reference_gelu(x64), leaf64, dy.double())
    # dx carries the rounding of dy (out dtype) and of dx itself (in dtype): the looser tolerance applies.
    _assert_matches(dx, dx_ref, max(TOL[in_dtype], TOL[out_dtype]))


@pytest.mark.parametrize("in_dtype", [F32, BF16, F16, F64], ids=lambda d: str(d).replace("torch.", ""))
def test_large_magnitudes(impl, in_dtype):
    # |x| up to ~4e3 (fp16: clamped to 6e4): x^3 is far beyond exp's range; both tails must saturate (y = x for
    # large positive x, 0 for large negative), in forward and backward, without overflow to NaN.
    _skip_unsupported(impl, in_dtype)
    x = _make((3, 300), in_dtype, seed=5, scale=1e3).requires_grad_()
    y = fastgelu(x)
    x64 = x.detach().double().requires_grad_()
    ref = reference_gelu(x64)
    _assert_matches(y, ref, TOL[in_dtype])
    dy = _make(y.shape, in_dtype, seed=6, scale=1.0)
    (dx,) = torch.autograd.grad(y, x, dy)
    (dx_ref,) = torch.autograd.grad(ref, x64, dy.double())
    _assert_matches(dx, dx_ref, TOL[in_dtype])


def test_negative_tail_is_accurate(impl):
    # For x << 0, 1 + tanh(u) cancels in fp32; x * sigmoid(2u) does not, so every element keeps fp32's relative
    # accuracy. Below x = -5 even the fp64 reference cancels (tanh(u) rounds to -1), so the range stops there.
    x = torch.linspace(-5.0, -3.0, 257, dtype=F32)
    ref = reference_gelu(x)

    def worst_relative_error(y):
        return ((y.double() - ref) / ref).abs().max().item()

    assert worst_relative_error(fastgelu(x)) < 1e-5
    assert worst_relative_error(_stock(x)) > 1e-3  # the stock fp32 chain loses digits here: the test discriminates


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # interpreter: -inf * 0 in numpy
def test_nan_and_inf_like_the_stock_op(impl):
    x = _make((2, 9), F32, seed=7)
    x[0, 3] = float("nan")
    x[1, 2] = float("inf")
    x[1, 5] = -float("inf")
    y = fastgelu(x)
    stock = _stock(x)
    assert torch.equal(torch.isnan(y), torch.isnan(stock))  # NaN only at the NaN and at -inf (-inf * 0), as stock
    assert torch.isnan(y[0, 3]) and torch.isnan(y[1, 5]) and y[1, 2] == float("inf")
    finite = torch.isfinite(stock)
    torch.testing.assert_close(y[finite], stock[finite], rtol=1e-6, atol=1e-7)


def test_deterministic(impl):
    x = _make((5, 1000), BF16, seed=8)
    assert torch.equal(fastgelu(x, F32), fastgelu(x, F32))


def test_impl_calls_count_only_what_ran(impl):
    other = {"cpu": "triton", "triton": "cpu"}[impl]
    before = IMPL_CALLS.copy()
    x = _make((3, 7), F32).requires_grad_()
    fastgelu(x).sum().backward()
    after = IMPL_CALLS
    assert after[f"{impl}.fwd"] - before[f"{impl}.fwd"] == 1
    assert after[f"{impl}.bwd"] - before[f"{impl}.bwd"] == 1
    assert after[f"{other}.fwd"] == before[f"{other}.fwd"] and after[f"{other}.bwd"] == before[f"{other}.bwd"]


def test_opcheck():
    g = torch.Generator().manual_seed(9)
    x = torch.randn(3, 5, 7, generator=g, requires_grad=True)
    xb = torch.randn(4, 9, generator=g).to(BF16).requires_grad_()
    xt = torch.randn(6, 5, generator=g).t().requires_grad_()
    xs = torch.randn(4, 12, generator=g)[:, ::2].requires_grad_()
    for args in [(x, None), (x, BF16), (xb, F32), (xt, None), (xs, None)]:
        torch.library.opcheck(torch.ops.e2eprof.fastgelu.default, args)
    torch.library.opcheck(torch.ops.e2eprof.fastgelu_backward.default, (torch.randn(3, 5), torch.randn(3, 5), BF16))


def test_gradcheck_fp64():
    x = torch.randn(2, 3, 5, dtype=F64, requires_grad=True) * 3
    assert torch.autograd.gradcheck(fastgelu, (x.detach().requires_grad_(),))





def test_rejects_non_float():
    with pytest.raises(TypeError):
        fastgelu(torch.ones(2, 3, dtype=torch.int64))
    with pytest.raises(TypeError):
        fastgelu(torch.randn(2, 3), torch.int32)


@pytest.mark.parametrize("in_dtype", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("autocast", [False, True], ids=["plain", "autocast-bf16"])
def test_output_dtype_follows_the_stock_op(in_dtype, autocast):
    x = _make((2, 8), in_dtype)
    with torch.autocast("cpu", dtype=BF16, enabled=autocast):
        assert gelu_like_transformers(x).dtype == _stock(x).dtype


# --- the patch on a real tiny GPT-2 ---------------------------------------------------------------------------


@pytest.fixture
def model():
    return build_model(resolve_model("gpt2-tiny"), attn_implementation="eager", seed=0)


@pytest.fixture
def input_ids():
    return torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))


def _assert_reverted(model) -> None:
    assert activations.NewGELUActivation is STOCK_GELU
    assert modeling_gpt2.nn is STOCK_NN
    acts = [m for m in model.modules() if isinstance(m, STOCK_GELU)]
    assert acts and all(type(m) is STOCK_GELU and "forward" not in vars(m) for m in acts)


def test_patch_on_gpt2_sites_calls_outputs_and_revert(impl, model, input_ids):
    with torch.no_grad():
        expected = model(input_ids).logits
    layers = model.config.n_layer
    before = IMPL_CALLS.copy()
    applied = apply_patch(PATCH, model)
    try:
        # One activation module per MLP, nothing else in the model is a NewGELUActivation.
        assert applied.n_sites == layers
        assert applied.sites == [{"target": "transformers.activations:NewGELUActivation", "kind": "class",
                                  "count": layers}]
        assert all(type(block.mlp.act) is FastNewGELU for block in model.transformer.h)
        with torch.no_grad():
            got = model(input_ids).logits
        assert applied.calls == layers
        assert IMPL_CALLS[f"{impl}.fwd"] - before[f"{impl}.fwd"] == layers
        # (B, T, 4 * n_embd) MLP activations.
        assert dict(applied.signatures()) == {f"float32[2,16,{4 * model.config.n_embd}]": layers}
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    finally:
        applied.revert()
    _assert_reverted(model)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids).logits, expected, rtol=0, atol=0)


def test_patch_on_gpt2_training_gradients_match_stock(impl, model, input_ids):
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


def test_patch_verify_mode_passes(model, input_ids):
    applied = apply_patch(PATCH, model)
    try:
        applied.set_verify(True)
        with torch.no_grad():
            model(input_ids)
        checks = applied.checks()
    finally:
        applied.revert()
    assert len(checks) == 1 and checks[0].calls == model.config.n_layer
    assert checks[0].passed, checks[0].problems
    assert 0 < checks[0].stock_error < 1e-6  # the stock fp32 chain against the fp64 reference


def test_patch_other_models_keep_the_stock_class(model):
    applied = apply_patch(PATCH, model)
    try:
        other = build_model(resolve_model("gpt2-tiny"), attn_implementation="eager", seed=1)
        assert all(type(block.mlp.act) is STOCK_GELU for block in other.transformer.h)
    finally:
        applied.revert()
    _assert_reverted(model)


def test_patch_without_a_model_is_refused():
    with pytest.raises(PatchError, match="zero sites"):
        apply_patch(PATCH)
    assert activations.NewGELUActivation is STOCK_GELU
