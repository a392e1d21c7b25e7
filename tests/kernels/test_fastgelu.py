"""Correctness of e2eprof.kernels.fastgelu on CPU: the CPU implementation and the Triton kernels (interpreter), both
GELUs (tanh approximation and exact erf), and the fastgelu patch on real (tiny, random-weight) GPT-2 and BERT.

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
from e2eprof.kernels.fastgelu.patch import PATCH, FastGELU, gelu_like_transformers, gelu_variant
from e2eprof.patching import apply_patch
from e2eprof.workloads.models import build_model, resolve_model

F64, F32, BF16, F16 = torch.float64, torch.float32, torch.bfloat16, torch.float16

# Relative-norm tolerance by output dtype: a few units of the dtype's rounding (bf16 2^-8, fp16 2^-11, fp32 2^-24).
TOL = {F64: 1e-12, F32: 1e-5, BF16: 1e-2, F16: 2e-3}

DTYPE_PAIRS = [(F32, F32), (BF16, BF16), (BF16, F32), (F16, F16), (F32, BF16), (F64, F64)]  # (input, output)

# Captured at import, before any test patches anything: the genuine objects.
STOCK_GELU = activations.NewGELUActivation
STOCK_ERF_GELU = activations.GELUActivation
STOCK_NN = torch.nn

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
IMPLS = [
    "cpu",
    pytest.param(
        "triton",
        marks=pytest.mark.skipif(not (TRITON_AVAILABLE and _INTERPRET), reason="needs triton and TRITON_INTERPRET=1"),
    ),
]


# torch.nn.functional.gelu's names: "tanh" is GPT-2's gelu_new, "none" the exact erf GELU (BERT's gelu).
APPROXIMATE = ["tanh", "none"]


@pytest.fixture(params=APPROXIMATE)
def approximate(request):
    return request.param


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


def _stock(x: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """The transformers forward the patch replaces: NewGELUActivation (tanh) or GELUActivation (erf)."""
    cls = STOCK_GELU if approximate == "tanh" else STOCK_ERF_GELU
    return cls.forward(cls(), x)


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


def test_reference_is_the_transformers_formula(approximate):
    # The yardstick (torch's GELU) and the replaced transformers forward (gelu_new, gelu) agree in fp64, and so does
    # GELUActivation's own python erf formula (use_gelu_python=True).
    x = _make((1000,), F64, scale=4.0)
    torch.testing.assert_close(reference_gelu(x, approximate), _stock(x, approximate), rtol=1e-13, atol=1e-15)
    if approximate == "none":
        python_erf = STOCK_ERF_GELU(use_gelu_python=True)
        torch.testing.assert_close(reference_gelu(x, "none"), python_erf(x), rtol=1e-13, atol=1e-15)
    # The two GELUs differ by far more than fp64 rounding: each test below tells them apart.
    assert (reference_gelu(x, "tanh") - reference_gelu(x, "none")).abs().max() > 1e-4


def test_reference_rejects_unknown_approximation():
    with pytest.raises(ValueError, match="approximate"):
        reference_gelu(torch.ones(2), "sigmoid")


@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("name,shape,view", SHAPES, ids=[s[0] for s in SHAPES])
def test_forward(impl, approximate, name, shape, view, in_dtype, out_dtype):
    _skip_unsupported(impl, in_dtype, out_dtype)
    x = _make(shape, in_dtype, view=view)
    x_before = x.clone()
    calls = IMPL_CALLS[f"{impl}.fwd"]
    y = fastgelu(x, out_dtype, approximate)
    assert IMPL_CALLS[f"{impl}.fwd"] == calls + 1
    assert y.dtype == out_dtype
    assert y.stride() == _stock(x, approximate).stride()  # e2eprof's op check compares strides with the stock output
    assert torch.equal(x, x_before)  # inputs are not mutated
    _assert_matches(y, reference_gelu(x, approximate), TOL[out_dtype])


@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("name,shape,view", SHAPES, ids=[s[0] for s in SHAPES])
def test_backward(impl, approximate, name, shape, view, in_dtype, out_dtype):
    _skip_unsupported(impl, in_dtype, out_dtype)
    leaf = _make(shape, in_dtype).requires_grad_()
    x = view(leaf) if view is not None else leaf
    y = fastgelu(x, out_dtype, approximate)
    dy = _make(y.shape, out_dtype, seed=1, scale=1.0)
    calls = IMPL_CALLS[f"{impl}.bwd"]
    (dx,) = torch.autograd.grad(y, leaf, dy)
    assert IMPL_CALLS[f"{impl}.bwd"] == calls + 1
    assert dx.dtype == in_dtype and dx.shape == leaf.shape
    leaf64 = leaf.detach().double().requires_grad_()
    x64 = view(leaf64) if view is not None else leaf64
    (dx_ref,) = torch.autograd.grad(reference_gelu(x64, approximate), leaf64, dy.double())
    # dx carries the rounding of dy (out dtype) and of dx itself (in dtype): the looser tolerance applies.
    _assert_matches(dx, dx_ref, max(TOL[in_dtype], TOL[out_dtype]))


@pytest.mark.parametrize("in_dtype", [F32, BF16, F16, F64], ids=lambda d: str(d).replace("torch.", ""))
def test_large_magnitudes(impl, approximate, in_dtype):
    # |x| up to ~4e3 (fp16: clamped to 6e4): x^3 and x^2 are far beyond exp's range; both tails must saturate (y = x
    # for large positive x, 0 for large negative), in forward and backward, without overflow to NaN.
    _skip_unsupported(impl, in_dtype)
    x = _make((3, 300), in_dtype, seed=5, scale=1e3).requires_grad_()
    y = fastgelu(x, approximate=approximate)
    x64 = x.detach().double().requires_grad_()
    ref = reference_gelu(x64, approximate)
    _assert_matches(y, ref, TOL[in_dtype])
    dy = _make(y.shape, in_dtype, seed=6, scale=1.0)
    (dx,) = torch.autograd.grad(y, x, dy)
    (dx_ref,) = torch.autograd.grad(ref, x64, dy.double())
    _assert_matches(dx, dx_ref, TOL[in_dtype])


def test_negative_tail_is_accurate(impl):
    # For x << 0, 1 + tanh(u) cancels in fp32; x * sigmoid(2u) does not, so every element keeps fp32's relative
    # accuracy. Below x = -5 even the fp64 reference cancels (tanh(u) rounds to -1), so the range stops there.
    x = torch.linspace(-5.0, -3.0, 257, dtype=F32)
    ref = reference_gelu(x)  # tanh only: the erf GELU keeps torch's formula, see cpu.py

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


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # interpreter: -inf * 0 in numpy
def test_erf_nan_and_inf_like_the_formula(impl):
    # Judged against the fp64 reference: torch's own fp32 CPU gelu returns NaN at +inf (its vectorised path), where
    # the formula, torch's fp64 gelu and CUDA give +inf. x * Phi(x): NaN stays NaN, +inf -> +inf, -inf -> -inf * 0.
    x = _make((2, 9), F32, seed=7)
    x[0, 3] = float("nan")
    x[1, 2] = float("inf")
    x[1, 5] = -float("inf")
    y = fastgelu(x, approximate="none")
    ref = reference_gelu(x, "none")
    assert torch.equal(torch.isnan(y), torch.isnan(ref))
    assert torch.isnan(y[0, 3]) and torch.isnan(y[1, 5]) and y[1, 2] == float("inf")
    finite = torch.isfinite(ref)
    torch.testing.assert_close(y[finite].double(), ref[finite], rtol=1e-6, atol=1e-7)


def test_deterministic(impl, approximate):
    x = _make((5, 1000), BF16, seed=8)
    assert torch.equal(fastgelu(x, F32, approximate), fastgelu(x, F32, approximate))


def test_impl_calls_count_only_what_ran(impl, approximate):
    other = {"cpu": "triton", "triton": "cpu"}[impl]
    before = IMPL_CALLS.copy()
    x = _make((3, 7), F32).requires_grad_()
    fastgelu(x, approximate=approximate).sum().backward()
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
    for args in [(x, None), (x, BF16), (xb, F32), (xt, None), (xs, None), (x, None, "none"), (xb, F32, "none")]:
        torch.library.opcheck(torch.ops.e2eprof.fastgelu.default, args)
    for approximate in APPROXIMATE:
        torch.library.opcheck(torch.ops.e2eprof.fastgelu_backward.default,
                              (torch.randn(3, 5), torch.randn(3, 5), BF16, approximate))


def test_gradcheck_fp64(approximate):
    x = torch.randn(2, 3, 5, dtype=F64, requires_grad=True) * 3
    assert torch.autograd.gradcheck(lambda t: fastgelu(t, approximate=approximate), (x.detach().requires_grad_(),))


def test_double_backward_raises_instead_of_a_silent_constant():
    x = torch.randn(2, 5, dtype=F64, requires_grad=True)
    with pytest.raises(RuntimeError, match="not differentiable"):
        torch.autograd.grad(fastgelu(x), x, torch.randn(2, 5, dtype=F64), create_graph=True)


@pytest.mark.parametrize("requires_grad", [True, False], ids=["grad", "no grad"])
def test_the_profiler_sees_one_op_event_per_call_and_one_backward(requires_grad):
    # e2eprof's ops table and op diff count profiler events: an autograd kernel that called the op again through the
    # dispatcher would show every forward twice (nested).
    x = torch.randn(3, 5, requires_grad=requires_grad)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        y = fastgelu(x)
        if requires_grad:
            y.sum().backward()
    names = [e.name for e in prof.events()]
    assert names.count("e2eprof::fastgelu") == 1, names
    assert names.count("e2eprof::fastgelu_backward") == (1 if requires_grad else 0), names


def test_rejects_non_float():
    with pytest.raises(TypeError):
        fastgelu(torch.ones(2, 3, dtype=torch.int64))
    with pytest.raises(TypeError):
        fastgelu(torch.randn(2, 3), torch.int32)


def test_rejects_unknown_approximation(impl):
    before = IMPL_CALLS.copy()
    with pytest.raises(ValueError, match="approximate"):
        fastgelu(torch.randn(2, 3), approximate="erf")  # torch's name for it is "none"
    assert IMPL_CALLS == before  # refused before any implementation ran


VARIANTS = {"tanh": lambda: STOCK_GELU(), "erf": lambda: STOCK_ERF_GELU(),
            "erf_python": lambda: STOCK_ERF_GELU(use_gelu_python=True)}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_is_read_from_the_module(variant):
    module = VARIANTS[variant]()
    assert gelu_variant(module) == variant
    x = _make((4, 33), F32, seed=11)
    torch.testing.assert_close(gelu_like_transformers(x, variant), module(x), rtol=1e-5, atol=1e-6)


def test_variant_refuses_an_act_it_cannot_vouch_for():
    module = STOCK_ERF_GELU()
    module.act = torch.nn.functional.silu  # a GELUActivation that does not compute GELU: never replaced silently
    with pytest.raises(RuntimeError, match="act"):
        gelu_variant(module)


def test_fastgelu_class_is_never_built_directly():
    with pytest.raises(TypeError, match="swaps it onto existing"):
        FastGELU()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("in_dtype", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("autocast", [False, True], ids=["plain", "autocast-bf16"])
def test_output_dtype_follows_the_stock_op(variant, in_dtype, autocast):
    x = _make((2, 8), in_dtype)
    with torch.autocast("cpu", dtype=BF16, enabled=autocast):
        assert gelu_like_transformers(x, variant).dtype == VARIANTS[variant]()(x).dtype


# --- the patch on real tiny GPT-2 and BERT models --------------------------------------------------------------

NEW_GELU_TARGET, ERF_GELU_TARGET = "transformers.activations:NewGELUActivation", "transformers.activations:GELUActivation"


def _build(name: str, seed: int = 0):
    return build_model(resolve_model(name), attn_implementation="sdpa", seed=seed)


def _input_ids(vocab: int):
    return torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(0))


def _assert_classes_restored(*models) -> None:
    assert activations.NewGELUActivation is STOCK_GELU and activations.GELUActivation is STOCK_ERF_GELU
    assert modeling_gpt2.nn is STOCK_NN
    for model in models:
        assert not any(type(m) is FastGELU for m in model.modules())


def test_patch_on_gpt2(impl, check_patch_on_model):
    model = _build("gpt2-tiny")
    layers = model.config.n_layer
    # One tanh-GELU module per MLP; GPT-2 has no GELUActivation, so that target counts zero.
    check_patch_on_model(PATCH, model, _input_ids(model.config.vocab_size), impl=impl, impl_calls=IMPL_CALLS,
                         sites={NEW_GELU_TARGET: layers, ERF_GELU_TARGET: 0})
    _assert_classes_restored(model)


def test_patch_on_bert(impl, check_patch_on_model):
    model = _build("bert-tiny")
    assert model.config.hidden_act == "gelu"
    # One erf-GELU module per layer's intermediate (FFN) block, one in the MLM head's transform; no tanh GELU.
    sites = model.config.num_hidden_layers + 1
    check_patch_on_model(PATCH, model, _input_ids(model.config.vocab_size), impl=impl, impl_calls=IMPL_CALLS,
                         sites={NEW_GELU_TARGET: 0, ERF_GELU_TARGET: sites})
    _assert_classes_restored(model)


def test_patch_on_bert_is_judged_as_the_erf_gelu():
    model = _build("bert-tiny")
    applied = apply_patch(PATCH, model)
    try:
        applied.set_verify(True)
        with torch.no_grad():
            model(input_ids=_input_ids(model.config.vocab_size))
        checks = applied.checks()
    finally:
        applied.revert()
    assert checks and all(c.passed for c in checks), [c.problems for c in checks]
    # Each call is judged against the erf reference, which the stock fp32 F.gelu meets to rounding; the tanh GELU is
    # ~1e-4 away from it (test_reference_is_the_transformers_formula), far beyond the 1e-5 fp32 floor, so a patch that
    # ran the tanh kernel on BERT would fail here.
    assert all(0 < c.stock_error < 1e-6 for c in checks)


def test_patch_other_models_keep_the_stock_class():
    model = _build("gpt2-tiny")
    applied = apply_patch(PATCH, model)
    try:
        others = [_build("gpt2-tiny", seed=1), _build("bert-tiny", seed=1)]
        assert all(type(m) is not FastGELU for other in others for m in other.modules())
    finally:
        applied.revert()
    _assert_classes_restored(model, *others)


def test_patch_without_a_model_is_refused():
    with pytest.raises(PatchError, match="zero sites"):
        apply_patch(PATCH)
    _assert_classes_restored()
