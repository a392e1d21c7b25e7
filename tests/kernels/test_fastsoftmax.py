"""Correctness of e2eprof.kernels.fastsoftmax on CPU: the CPU implementation and the Triton kernels (interpreter).

Every check compares against an fp64 reference with a relative-norm error (||out - ref|| / ||ref||) and requires NaN
positions to match exactly: allclose-style checks pass zeros or NaN, which is what these tests must catch.
"""

import os

import pytest
import torch

from e2eprof.kernels.fastsoftmax import IMPL_CALLS, TRITON_AVAILABLE, fastsoftmax, reference_softmax
from e2eprof.kernels.fastsoftmax import op as fs_op

F64, F32, BF16, F16 = torch.float64, torch.float32, torch.bfloat16, torch.float16

# Relative-norm tolerance by output dtype: a few units of the dtype's rounding (bf16 2^-8, fp16 2^-11, fp32 2^-24)
# summed over a row. The interpreter truncates fp32->bf16 instead of rounding (up to 2^-8), still well inside 1e-2.
TOL = {F64: 1e-12, F32: 1e-5, BF16: 1e-2, F16: 2e-3}

DTYPE_PAIRS = [(F32, F32), (BF16, F32), (BF16, BF16), (F16, F32), (F64, F64)]  # (input, output)

# The interpreter evaluates -inf - -inf in numpy, which warns; the NaN it yields is the behaviour under test.
_interp_nan_ok = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
IMPLS = [
    "cpu",
    pytest.param(
        "triton",
        marks=pytest.mark.skipif(not (TRITON_AVAILABLE and _INTERPRET), reason="needs triton and TRITON_INTERPRET=1"),
    ),
]

# (id, base shape, dim, transpose): transpose makes a non-contiguous input by swapping the last two dims of base.
SHAPES = [
    ("1x1", (1, 1), -1, False),
    ("3x7", (3, 7), -1, False),
    ("5x1000", (5, 1000), -1, False),
    ("4x17000-looped", (4, 17000), -1, False),  # above both fused-row limits: the looped kernels run
    ("0x5", (0, 5), -1, False),
    ("2x0", (2, 0), -1, False),
    ("2x3x5x9-last", (2, 3, 5, 9), -1, False),
    ("2x3x5x9-dim1", (2, 3, 5, 9), 1, False),
    ("transposed-last", (7, 5), -1, True),  # (5, 7) with strides (1, 5)
    ("transposed-dim0", (7, 5), 0, True),
]


@pytest.fixture(params=IMPLS)
def impl(request, monkeypatch):
    """Selects the implementation under test through the same env switch users have."""
    monkeypatch.setenv(fs_op.IMPL_ENV, request.param)
    return request.param


def _skip_unsupported(impl: str, in_dtype: torch.dtype, out_dtype: torch.dtype) -> None:
    if impl == "triton" and F64 in (in_dtype, out_dtype):
        pytest.skip("the Triton kernels accumulate in fp32; fp64 is a CPU-only path")


def _make(shape, transpose: bool, dtype: torch.dtype, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=F64) * scale
    if dtype == F16:
        x = x.clamp(-6e4, 6e4)  # stay finite in fp16 for the large-magnitude case
    x = x.to(dtype)
    return x.transpose(-1, -2) if transpose else x


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


@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("name,shape,dim,transpose", SHAPES, ids=[s[0] for s in SHAPES])
def test_forward(impl, name, shape, dim, transpose, in_dtype, out_dtype):
    _skip_unsupported(impl, in_dtype, out_dtype)
    x = _make(shape, transpose, in_dtype)
    x_before = x.clone()
    calls = IMPL_CALLS[f"{impl}.fwd"]
    y = fastsoftmax(x, dim, out_dtype)
    assert IMPL_CALLS[f"{impl}.fwd"] == calls + 1
    assert y.dtype == out_dtype and y.is_contiguous()
    assert torch.equal(x, x_before)  # inputs are not mutated
    _assert_matches(y, reference_softmax(x, dim), TOL[out_dtype])


@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("name,shape,dim,transpose", SHAPES, ids=[s[0] for s in SHAPES])
def test_backward(impl, name, shape, dim, transpose, in_dtype, out_dtype):
    _skip_unsupported(impl, in_dtype, out_dtype)
    x = _make(shape, transpose, in_dtype).requires_grad_()
    y = fastsoftmax(x, dim, out_dtype)
    dy = _make(y.shape, False, out_dtype, seed=1)
    calls = IMPL_CALLS[f"{impl}.bwd"]
    (dx,) = torch.autograd.grad(y, x, dy)
    assert IMPL_CALLS[f"{impl}.bwd"] == calls + 1
    assert dx.dtype == in_dtype and dx.shape == x.shape
    x64 = x.detach().double().requires_grad_()
    (dx_ref,) = torch.autograd.grad(reference_softmax(x64, dim), x64, dy.double())
    # dx carries the rounding of y (out dtype) and of dx itself (in dtype): the looser tolerance applies.
    _assert_matches(dx, dx_ref, max(TOL[in_dtype], TOL[out_dtype]))


def _masked_rows(in_dtype: torch.dtype, cols: int) -> torch.Tensor:
    """Rows with -inf masks: causal-style prefixes, a row whose first columns are all -inf, and an all -inf row."""
    rows = 6
    x = _make((rows, cols), False, F64, seed=2)
    j = torch.arange(cols)
    for i in range(rows - 2):
        x[i, j > i * cols // (rows - 2)] = -float("inf")  # causal: row i sees a growing prefix
    x[rows - 2, : cols - 3] = -float("inf")  # only the tail is finite: early tiles see only -inf
    x[rows - 1] = -float("inf")  # torch gives NaN for the whole row
    return x.to(in_dtype)


@_interp_nan_ok
@pytest.mark.parametrize("cols", [8, 17000], ids=["row-kernel", "looped"])
@pytest.mark.parametrize(
    "in_dtype,out_dtype", [(F32, F32), (BF16, F32), (BF16, BF16)], ids=["f32-f32", "bf16-f32", "bf16-bf16"]
)
def test_inf_masks_match_torch(impl, cols, in_dtype, out_dtype):
    x = _masked_rows(in_dtype, cols).requires_grad_()
    y = fastsoftmax(x, -1, out_dtype)
    torch_y = torch.softmax(x.detach().float(), -1)
    assert torch.equal(torch.isnan(y), torch.isnan(torch_y))
    assert torch.isnan(y[-1]).all() and not torch.isnan(y[:-1]).any()
    _assert_matches(y, reference_softmax(x, -1), TOL[out_dtype])

    dy = _make(y.shape, False, out_dtype, seed=3)
    (dx,) = torch.autograd.grad(y, x, dy)
    x64 = x.detach().double().requires_grad_()
    (dx_ref,) = torch.autograd.grad(torch.softmax(x64, -1), x64, dy.double())
    _assert_matches(dx, dx_ref, max(TOL[in_dtype], TOL[out_dtype]))


@_interp_nan_ok
@pytest.mark.parametrize("cols", [8, 17000], ids=["row-kernel", "looped"])
def test_nan_and_posinf_propagate_like_torch(impl, cols):
    x = _make((4, cols), False, F32, seed=4)
    x[1, cols // 2] = float("nan")
    x[2, cols - 1] = float("inf")
    y = fastsoftmax(x, -1, F32)
    torch_y = torch.softmax(x, -1)
    assert torch.equal(torch.isnan(y), torch.isnan(torch_y))
    assert torch.isnan(y[1]).all() and torch.isnan(y[2]).all()
    _assert_matches(y, reference_softmax(x, -1), TOL[F32])


@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS, ids=lambda d: str(d).replace("torch.", ""))
def test_large_magnitudes(impl, in_dtype, out_dtype):
    _skip_unsupported(impl, in_dtype, out_dtype)
    x = _make((3, 300), False, in_dtype, seed=5, scale=1e4)  # rows are near one-hot; exp would overflow unshifted
    y = fastsoftmax(x, -1, out_dtype)
    _assert_matches(y, reference_softmax(x, -1), TOL[out_dtype])


def test_deterministic(impl):
    x = _make((5, 1000), False, BF16, seed=6)
    assert torch.equal(fastsoftmax(x, -1, F32), fastsoftmax(x, -1, F32))


def test_impl_calls_count_only_what_ran(impl):
    other = {"cpu": "triton", "triton": "cpu"}[impl]
    before = IMPL_CALLS.copy()
    x = _make((3, 7), False, F32).requires_grad_()
    fastsoftmax(x, 0).sum().backward()
    after = IMPL_CALLS
    assert after[f"{impl}.fwd"] - before[f"{impl}.fwd"] == 1
    assert after[f"{impl}.bwd"] - before[f"{impl}.bwd"] == 1
    assert after[f"{other}.fwd"] == before[f"{other}.fwd"] and after[f"{other}.bwd"] == before[f"{other}.bwd"]


def test_out_dtype_default_is_input_dtype():
    assert fastsoftmax(torch.randn(2, 3, dtype=BF16)).dtype == BF16


def test_opcheck():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(3, 5, 7, generator=g, requires_grad=True)
    xb = torch.randn(4, 9, generator=g).to(BF16).requires_grad_()
    for args in [(x, -1, None), (x, 1, F32), (xb, -1, F32), (xb, 0, BF16)]:
        torch.library.opcheck(torch.ops.e2eprof.fastsoftmax.default, args)
    y = torch.softmax(torch.randn(3, 5, 7, generator=g), 1)
    dy = torch.randn(3, 5, 7, generator=g)
    torch.library.opcheck(torch.ops.e2eprof.fastsoftmax_backward.default, (dy, y, 1, BF16))


@pytest.mark.parametrize("dim", [-1, 1, 0])
def test_gradcheck_fp64(dim):
    x = torch.randn(2, 3, 5, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: fastsoftmax(t, dim), (x,))


@pytest.mark.filterwarnings("ignore:Your compiler for AOTAutograd:UserWarning")  # from torch's own test backend
def test_torch_compile_keeps_the_named_ops():
    """Under torch.compile (dynamo + AOTAutograd, no C++ compiler needed) both ops stay opaque calls in the graphs,
    run, and give eager's result and gradient."""
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    backend = AotEagerAndRecordGraphs()
    compiled = torch.compile(lambda t: fastsoftmax(t * 2, 1), backend=backend, fullgraph=True)
    x = torch.randn(2, 3, 5, dtype=F64, requires_grad=True)
    dy = torch.randn(2, 3, 5, dtype=F64)
    before = IMPL_CALLS.copy()
    y = compiled(x)
    (dx,) = torch.autograd.grad(y, x, dy)
    assert "torch.ops.e2eprof.fastsoftmax.default" in backend.fw_graphs[0].code
    assert "torch.ops.e2eprof.fastsoftmax_backward.default" in backend.bw_graphs[0].code
    assert IMPL_CALLS["cpu.fwd"] - before["cpu.fwd"] == 1 and IMPL_CALLS["cpu.bwd"] - before["cpu.bwd"] == 1
    y_eager = fastsoftmax(x * 2, 1)
    (dx_eager,) = torch.autograd.grad(y_eager, x, dy)
    torch.testing.assert_close(y, y_eager)
    torch.testing.assert_close(dx, dx_eager)


def test_double_backward_raises_instead_of_a_silent_constant():
    x = torch.randn(2, 5, dtype=F64, requires_grad=True)
    with pytest.raises(RuntimeError, match="not differentiable"):
        torch.autograd.grad(fastsoftmax(x), x, torch.randn(2, 5, dtype=F64), create_graph=True)


def test_rejects_non_float():
    with pytest.raises(TypeError):
        fastsoftmax(torch.ones(2, 3, dtype=torch.int64))
    with pytest.raises(TypeError):
        fastsoftmax(torch.randn(2, 3), -1, torch.int32)


@pytest.mark.parametrize("requires_grad", [True, False], ids=["grad", "no grad"])
def test_the_profiler_sees_one_op_event_per_call_and_one_backward(requires_grad):
    # e2eprof's ops table and op diff count profiler events: an autograd kernel that called the op again through the
    # dispatcher would show every forward twice (nested).
    x = torch.randn(3, 5, requires_grad=requires_grad)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        y = fastsoftmax(x, -1)
        if requires_grad:
            y.sum().backward()
    names = [e.name for e in prof.events()]
    assert names.count("e2eprof::fastsoftmax") == 1, names
    assert names.count("e2eprof::fastsoftmax_backward") == (1 if requires_grad else 0), names
