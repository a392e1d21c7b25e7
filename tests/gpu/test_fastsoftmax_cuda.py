"""fastsoftmax on CUDA: the compiled Triton kernels at attention shapes, forward and backward, against fp64.

The CPU suite runs the same kernels under the interpreter; this one catches what only compilation shows
(num_warps, register limits, the looped kernels' codegen, int64 offsets on large tensors).
"""

import pytest
import torch

from e2eprof.kernels.fastsoftmax import IMPL_CALLS, fastsoftmax, reference_softmax

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

F32, BF16 = torch.float32, torch.bfloat16
TOL = {F32: 1e-5, BF16: 1e-2}  # relative-norm error by dtype, as in tests/kernels/test_fastsoftmax.py
PAIRS = [(BF16, F32), (F32, F32), (BF16, BF16)]  # (input, output): autocast eager attention, fp32, pure bf16
ATTN = (8, 12, 1024, 1024)  # (B, nh, T, T): GPT-2 124M at batch 8 x 1024


def _randn(shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=g, device="cuda", dtype=F32).to(dtype)


def _check(out: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    """No NaN where the fp64 reference has none (and the same NaN where it has some); relative-norm error <= tol."""
    assert type(out) is torch.Tensor and out.shape == ref.shape
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    keep = ~torch.isnan(ref)
    err = ((out.double() - ref)[keep].norm() / ref[keep].norm()).item()
    assert err <= tol, f"relative-norm error {err:.3g} > {tol:g}"


def _fwd_bwd(x: torch.Tensor, dim: int, out_dtype: torch.dtype, in_dtype: torch.dtype) -> None:
    x = x.requires_grad_()
    fwd, bwd = IMPL_CALLS["triton.fwd"], IMPL_CALLS["triton.bwd"]
    y = fastsoftmax(x, dim, out_dtype)
    assert IMPL_CALLS["triton.fwd"] == fwd + 1
    assert y.dtype == out_dtype and y.is_cuda and y.is_contiguous()
    _check(y, reference_softmax(x.detach(), dim), TOL[out_dtype])

    dy = _randn(y.shape, out_dtype, seed=1)
    (dx,) = torch.autograd.grad(y, x, dy)
    assert IMPL_CALLS["triton.bwd"] == bwd + 1
    assert dx.dtype == in_dtype
    del y
    x64 = x.detach().double().requires_grad_()
    (dx_ref,) = torch.autograd.grad(torch.softmax(x64, dim), x64, dy.double())
    _check(dx, dx_ref, max(TOL[in_dtype], TOL[out_dtype]))


@pytest.mark.parametrize("causal", [False, True], ids=["dense", "causal"])
@pytest.mark.parametrize("in_dtype,out_dtype", PAIRS, ids=["bf16-f32", "f32-f32", "bf16-bf16"])
def test_attention_shape(in_dtype, out_dtype, causal):
    x = _randn(ATTN, in_dtype, seed=0) * 3
    if causal:
        T = ATTN[-1]
        mask = torch.ones(T, T, dtype=torch.bool, device="cuda").triu(1)  # (T, T), True above the diagonal
        x = x.masked_fill(mask, -float("inf"))
    _fwd_bwd(x, -1, out_dtype, in_dtype)
    torch.cuda.synchronize()


@pytest.mark.parametrize(
    "shape,dim",
    [
        ((64, 10000), -1),  # forward: one row per program at BLOCK 16384, 16 warps; backward: looped
        ((32, 50000), -1),  # both looped
        ((4, 12, 257, 33), 2),  # non-last dim, odd sizes
    ],
    ids=["10k", "50k-looped", "dim2"],
)
@pytest.mark.parametrize("in_dtype,out_dtype", PAIRS, ids=["bf16-f32", "f32-f32", "bf16-bf16"])
def test_other_shapes(shape, dim, in_dtype, out_dtype):
    _fwd_bwd(_randn(shape, in_dtype, seed=2), dim, out_dtype, in_dtype)


def test_all_inf_row_and_nan_like_torch():
    x = _randn((4, 20000), F32, seed=3)
    x[0] = -float("inf")
    x[1, :19990] = -float("inf")  # early tiles see only -inf
    x[2, 7] = float("nan")
    for cols in (20000, 100):  # looped kernel, then the one-row kernel
        xs = x[:, -cols:].contiguous()
        y = fastsoftmax(xs, -1, F32)
        assert torch.equal(torch.isnan(y), torch.isnan(torch.softmax(xs, -1)))


@pytest.mark.parametrize("cols", [2**14, 2**14 + 1], ids=["row-kernel", "looped"])
def test_int64_offsets(cols):
    # rows * cols > 2**31: a 32-bit row offset would wrap and leave the last rows unwritten or write wrong rows.
    rows = 2**31 // cols + 2
    x = torch.zeros(rows, cols, device="cuda", dtype=BF16)  # (R, C), 4 GiB
    x[-1, -1] = 10.0
    y = fastsoftmax(x, -1, BF16)
    row_sums = y.float().sum(-1)  # (R,)
    assert (row_sums - 1).abs().max().item() < 1e-2
    torch.testing.assert_close(y[-1].float(), torch.softmax(x[-1].float(), -1), rtol=1e-2, atol=1e-6)
