"""Correctness of e2eprof.kernels.swiglu on CPU (CPU implementation and Triton kernels under the interpreter), and of
the swiglu patch on a llama-tiny model.

Every check compares against an fp64 reference with a relative-norm error and requires NaN positions to match.
"""

import os

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama import modeling_llama

from e2eprof.errors import PatchError
from e2eprof.kernels.swiglu import IMPL_CALLS, TRITON_AVAILABLE, reference_swiglu, swiglu
from e2eprof.kernels.swiglu import op as sw_op
from e2eprof.kernels.swiglu.patch import PATCH, FusedSwiGLULlamaMLP
from e2eprof.patching import apply_patch
from e2eprof.workloads.models import build_model, resolve_model

F64, F32, BF16, F16 = torch.float64, torch.float32, torch.bfloat16, torch.float16

# Relative-norm tolerance by dtype: a few roundings of the dtype. The interpreter truncates fp32->bf16 (up to 2^-8).
TOL = {F64: 1e-12, F32: 1e-5, BF16: 1e-2, F16: 2e-3}

# (gate dtype, up dtype): autocast gives both in bf16/fp16; fp32 models give fp32; mixed ones are promoted.
DTYPES = [(F32, F32), (BF16, BF16), (F16, F16), (BF16, F32), (F64, F64)]

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
IMPLS = [
    "cpu",
    pytest.param(
        "triton",
        marks=pytest.mark.skipif(not (TRITON_AVAILABLE and _INTERPRET), reason="needs triton and TRITON_INTERPRET=1"),
    ),
]

# (id, shape, transpose): transpose makes non-contiguous inputs by swapping the last two dims of shape.
SHAPES = [
    ("1", (1,), False),
    ("1x1", (1, 1), False),
    ("3x7", (3, 7), False),
    ("2x1500-two-blocks", (2, 1500), False),  # 3000 elements: a full block, a second one and a masked tail
    ("2x3x5x9", (2, 3, 5, 9), False),
    ("transposed", (9, 5), True),
    ("0x5", (0, 5), False),
]


@pytest.fixture(params=IMPLS)
def impl(request, monkeypatch):
    """Selects the implementation under test through the same env switch users have."""
    monkeypatch.setenv(sw_op.IMPL_ENV, request.param)
    return request.param


def _skip_unsupported(impl, *dtypes):
    if impl == "triton" and F64 in dtypes:
        pytest.skip("the Triton kernels compute in fp32; fp64 is a CPU-only path")


def _make(shape, dtype, seed=0, scale=3.0, transpose=False) -> torch.Tensor:
    # scale 3: gate values reach both silu's linear and saturated regions.
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g, dtype=F64) * scale).to(dtype)
    return x.transpose(-1, -2) if transpose else x


def _rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    keep = ~torch.isnan(ref)
    diff = (out.double() - ref.double())[keep]
    den = ref.double()[keep].norm()
    return (diff.norm() / den).item() if den > 0 else diff.norm().item()


def _assert_matches(out: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    """Plain tensor, same shape, NaN positions equal, relative-norm error over non-NaN positions at most tol."""
    assert type(out) is torch.Tensor
    assert out.shape == ref.shape
    nan_out, nan_ref = torch.isnan(out), torch.isnan(ref)
    assert torch.equal(nan_out, nan_ref), f"NaN at {nan_out.sum()} positions, reference at {nan_ref.sum()}"
    err = _rel_error(out, ref)
    assert err <= tol, f"relative-norm error {err:.3g} > {tol:g}"


ids = lambda d: str(d).replace("torch.", "")  # noqa: E731


@pytest.mark.parametrize("g_dtype,u_dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("name,shape,transpose", SHAPES, ids=[s[0] for s in SHAPES])
def test_forward(impl, name, shape, transpose, g_dtype, u_dtype):
    _skip_unsupported(impl, g_dtype, u_dtype)
    gate = _make(shape, g_dtype, transpose=transpose)
    up = _make(shape, u_dtype, seed=1, transpose=transpose)
    before = gate.clone(), up.clone()
    calls = IMPL_CALLS[f"{impl}.fwd"]
    y = swiglu(gate, up)
    assert IMPL_CALLS[f"{impl}.fwd"] == calls + 1
    assert torch.equal(gate, before[0]) and torch.equal(up, before[1])  # inputs are not mutated
    stock = F.silu(gate) * up
    assert y.dtype == stock.dtype and y.shape == gate.shape and y.is_contiguous()
    _assert_matches(y, reference_swiglu(gate, up), TOL[y.dtype])
    # The stock path rounds silu(gate) to the dtype before multiplying, we round once (to the nearest value), so we
    # are never further from the reference. Not under the interpreter: it truncates to bf16 instead of rounding.
    if impl == "cpu":
        ref = reference_swiglu(gate, up)
        assert _rel_error(y, ref) <= max(_rel_error(stock, ref), TOL[F32])


@pytest.mark.parametrize("g_dtype,u_dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("name,shape,transpose", SHAPES, ids=[s[0] for s in SHAPES])
def test_backward(impl, name, shape, transpose, g_dtype, u_dtype):
    _skip_unsupported(impl, g_dtype, u_dtype)
    gate = _make(shape, g_dtype, transpose=transpose).requires_grad_()
    up = _make(shape, u_dtype, seed=1, transpose=transpose).requires_grad_()
    y = swiglu(gate, up)
    dy = _make(y.shape, y.dtype, seed=2)
    calls = IMPL_CALLS[f"{impl}.bwd"]
    dgate, dup = torch.autograd.grad(y, (gate, up), dy)
    assert IMPL_CALLS[f"{impl}.bwd"] == calls + 1
    assert dgate.dtype == g_dtype and dup.dtype == u_dtype
    assert dgate.shape == gate.shape and dup.shape == up.shape
    g64 = gate.detach().double().requires_grad_()
    u64 = up.detach().double().requires_grad_()
    dgate_ref, dup_ref = torch.autograd.grad(reference_swiglu(g64, u64), (g64, u64), dy.double())
    loose = max(TOL[g_dtype], TOL[u_dtype], TOL[y.dtype])
    _assert_matches(dgate, dgate_ref, loose)
    _assert_matches(dup, dup_ref, loose)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # interpreter: exp(-g) -> inf, wanted
@pytest.mark.parametrize("g_dtype,u_dtype", DTYPES, ids=ids)
def test_large_magnitudes(impl, g_dtype, u_dtype):
    # |gate| up to ~1e3 (fp16 stays finite: silu(g) * u ~ 1e3 * 3): exp(-g) overflows for g << 0 and must give 0.
    _skip_unsupported(impl, g_dtype, u_dtype)
    gate = _make((4, 300), g_dtype, seed=3, scale=300.0).requires_grad_()
    up = _make((4, 300), u_dtype, seed=4).requires_grad_()
    y = swiglu(gate, up)
    assert not torch.isnan(y).any()
    _assert_matches(y, reference_swiglu(gate, up), TOL[y.dtype])
    dy = _make(y.shape, y.dtype, seed=5)
    dgate, dup = torch.autograd.grad(y, (gate, up), dy)
    g64 = gate.detach().double().requires_grad_()
    u64 = up.detach().double().requires_grad_()
    dgate_ref, dup_ref = torch.autograd.grad(reference_swiglu(g64, u64), (g64, u64), dy.double())
    loose = max(TOL[g_dtype], TOL[u_dtype], TOL[y.dtype])
    _assert_matches(dgate, dgate_ref, loose)
    _assert_matches(dup, dup_ref, loose)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter evaluates exp overflow and inf * 0 in numpy
def test_special_values_like_stock(impl):
    gate = torch.tensor([-float("inf"), float("inf"), float("nan"), -100.0, 100.0, 0.0])
    up = torch.tensor([1.0, 2.0, 1.0, 1.0, 1.0, float("nan")])
    y = swiglu(gate, up)
    stock = F.silu(gate) * up
    assert torch.equal(torch.isnan(y), torch.isnan(stock))
    finite = ~torch.isnan(stock)
    assert torch.equal(y[finite], stock[finite])


def test_deterministic(impl):
    gate, up = _make((6, 100), BF16), _make((6, 100), BF16, seed=1)
    assert torch.equal(swiglu(gate, up), swiglu(gate, up))


def test_impl_calls_count_only_what_ran(impl):
    other = {"cpu": "triton", "triton": "cpu"}[impl]
    before = IMPL_CALLS.copy()
    gate = _make((3, 7), F32).requires_grad_()
    swiglu(gate, _make((3, 7), F32, seed=1)).sum().backward()
    assert IMPL_CALLS[f"{impl}.fwd"] - before[f"{impl}.fwd"] == 1
    assert IMPL_CALLS[f"{impl}.bwd"] - before[f"{impl}.bwd"] == 1
    assert IMPL_CALLS[f"{other}.fwd"] == before[f"{other}.fwd"] and IMPL_CALLS[f"{other}.bwd"] == before[f"{other}.bwd"]


def test_opcheck():
    g = torch.Generator().manual_seed(7)
    gate = torch.randn(3, 5, 8, generator=g, requires_grad=True)
    up = torch.randn(3, 5, 8, generator=g, requires_grad=True)
    gb = torch.randn(4, 8, generator=g).to(BF16).requires_grad_()
    ub = torch.randn(4, 8, generator=g).to(BF16).requires_grad_()
    for args in [(gate, up), (gb, ub)]:
        torch.library.opcheck(torch.ops.e2eprof.swiglu.default, args)
    dy = torch.randn(3, 5, 8, generator=g)
    torch.library.opcheck(torch.ops.e2eprof.swiglu_backward.default, (dy, gate.detach(), up.detach()))


def test_gradcheck_fp64():
    gate = torch.randn(3, 6, dtype=F64, requires_grad=True)
    up = torch.randn(3, 6, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(swiglu, (gate, up))




def test_bad_arguments():
    with pytest.raises(ValueError, match="up"):
        swiglu(torch.randn(2, 3), torch.randn(3))  # no broadcasting
    with pytest.raises(TypeError):
        swiglu(torch.ones(2, 3, dtype=torch.int64), torch.ones(2, 3, dtype=torch.int64))


# --- the patch on a real model ---


@pytest.fixture(scope="module")
def llama():
    return build_model(resolve_model("llama-tiny"), attn_implementation="eager", seed=0)


@pytest.mark.parametrize("patch_impl", IMPLS)
def test_patch_on_llama_tiny(llama, patch_impl, monkeypatch, check_patch_on_model):
    monkeypatch.setenv(sw_op.IMPL_ENV, patch_impl)
    ids = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(8))
    mlps = [m for m in llama.modules() if type(m) is modeling_llama.LlamaMLP]
    assert len(mlps) == llama.config.num_hidden_layers == 2
    check_patch_on_model(PATCH, llama, ids, impl=patch_impl, impl_calls=IMPL_CALLS, sites={PATCH.targets[0]: 2})
    assert modeling_llama.LlamaMLP is not FusedSwiGLULlamaMLP


def test_patch_refuses_another_activation(llama):
    mlp = llama.model.layers[0].mlp
    stock_act = mlp.act_fn
    applied = apply_patch(PATCH, llama)
    try:
        mlp.act_fn = torch.nn.GELU()  # a Llama variant with another activation must not be silently changed
        with pytest.raises(RuntimeError, match="GELU"):
            mlp(torch.randn(1, 3, llama.config.hidden_size))
    finally:
        applied.revert()
        mlp.act_fn = stock_act


def test_patch_refuses_bert_and_names_what_it_is():
    bert = build_model(resolve_model("bert-tiny"), attn_implementation="eager", seed=0)
    with pytest.raises(PatchError, match="applies to llama") as info:
        apply_patch(PATCH, bert)
    assert "'bert'" in str(info.value)
