"""kernels/_launch.py on CUDA: after the first call of each kind, a built-in kernel is launched through its compiled
launcher, and the result is the one `kernel[grid]` gives, bit for bit, whatever Triton specialises on (dtype,
pointer alignment, a column count of 1 or a multiple of 16), inside a CUDA graph and on a side stream too."""

import pytest
import torch

import e2eprof.kernels._launch as launch_module
from e2eprof.kernels.fastgelu import fastgelu
from e2eprof.kernels.fastlayernorm.op import fastlayernorm
from e2eprof.kernels.fastsoftmax import fastsoftmax
from e2eprof.kernels.fusedsoftmax.op import fusedsoftmax
from e2eprof.kernels.rmsnorm.op import rmsnorm
from e2eprof.kernels.swiglu.op import swiglu

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not launch_module._ENABLED,
                       reason="this Triton has no native_specialize_impl: no direct launch"),
]


def _randn(*shape, dtype=torch.float32, offset=0):
    """A contiguous tensor whose data starts `offset` elements into a fresh buffer (offset 1: not 16-byte aligned)."""
    n = 1
    for s in shape:
        n *= s
    base = torch.randn(n + offset, device="cuda", dtype=torch.float32).to(dtype)
    return base[offset:].view(shape)


def _ordinary(call):
    """call() with every launch through kernel[grid]."""
    enabled = launch_module._ENABLED
    launch_module._ENABLED = False
    try:
        return call()
    finally:
        launch_module._ENABLED = enabled


def _direct(call):
    """call() twice; the second must launch only directly. Returns its result."""
    call()
    before = dict(launch_module.STATS)
    out = call()
    assert launch_module.STATS["ordinary"] == before["ordinary"], "a repeated call of the same kind was not cached"
    assert launch_module.STATS["direct"] > before["direct"]
    return out


CASES = {
    "fastsoftmax bf16->fp32": lambda x: fastsoftmax(x, -1, torch.float32),
    "fastsoftmax": lambda x: fastsoftmax(x, -1),
    "fusedsoftmax": lambda x: fusedsoftmax(x.view(1, 1, *x.shape), None, 0.125),
    "fastgelu": lambda x: fastgelu(x),
    "fastlayernorm": lambda x: fastlayernorm(x, x.shape[-1], torch.ones(x.shape[-1], device="cuda", dtype=x.dtype),
                                             torch.zeros(x.shape[-1], device="cuda", dtype=x.dtype)),
    "rmsnorm": lambda x: rmsnorm(x, torch.ones(x.shape[-1], device="cuda", dtype=x.dtype), 1e-6),
    "swiglu": lambda x: swiglu(x, x.flip(-1).contiguous()),
}
# (rows, cols, dtype, offset): what Triton specialises on, each a kind of its own
KINDS = [(8, 64, torch.bfloat16, 0), (8, 64, torch.float32, 0), (8, 37, torch.float32, 0), (8, 1, torch.float32, 0),
         (8, 64, torch.float32, 1), (3, 48, torch.bfloat16, 1)]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: f"{k[0]}x{k[1]}-{str(k[2])[6:]}-offset{k[3]}")
def test_direct_launch_matches_kernel_grid_bit_for_bit(case, kind):
    rows, cols, dtype, offset = kind
    if case == "fastsoftmax bf16->fp32" and dtype != torch.bfloat16:
        pytest.skip("the autocast case reads bf16")
    x = _randn(rows, cols, dtype=dtype, offset=offset)
    call = CASES[case]
    expected = _ordinary(lambda: call(x))
    assert torch.equal(_direct(lambda: call(x)), expected)
    g = x.clone().requires_grad_()  # forward and backward, each launch of its own kind
    y = call(g)
    (grad,) = torch.autograd.grad((y.float() * torch.linspace(-1, 1, y.numel(), device="cuda").view(y.shape)).sum(), g)
    g2 = x.clone().requires_grad_()
    y2 = _ordinary(lambda: call(g2))
    (grad2,) = _ordinary(lambda: torch.autograd.grad(
        (y2.float() * torch.linspace(-1, 1, y2.numel(), device="cuda").view(y2.shape)).sum(), g2))
    assert torch.equal(y, y2) and torch.equal(grad, grad2)


def test_kinds_that_triton_compiles_apart_get_their_own_entries():
    launch_module._COMPILED.clear()
    for rows, cols, dtype, offset in KINDS:
        fastsoftmax(_randn(rows, cols, dtype=dtype, offset=offset))
    assert len(launch_module._COMPILED) == len(KINDS)  # dtype, alignment, cols % 16 and cols == 1 all tell apart


def test_direct_launches_replay_in_a_cuda_graph_and_run_on_the_current_stream():
    x = _randn(16, 128, dtype=torch.bfloat16)
    fastsoftmax(x, -1, torch.float32)  # compiled and cached before capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        before = launch_module.STATS["direct"]
        on_side = fastsoftmax(x, -1, torch.float32)
        assert launch_module.STATS["direct"] == before + 1
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(on_side, torch.softmax(x.float(), -1))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = fastsoftmax(x, -1, torch.float32)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, torch.softmax(x.float(), -1))


@pytest.mark.skipif(not launch_module._C_LAUNCH, reason="only Triton 3.6's launcher is called at its C entry point")
def test_every_built_in_kernel_is_launched_at_the_c_entry_point_on_triton_3_6():
    # None of the built-in kernels needs scratch memory, so each cached kind must take the C shortcut; the
    # bit-for-bit test above then checks that shortcut against kernel[grid].
    launch_module._COMPILED.clear()
    x = _randn(8, 64).requires_grad_()
    for call in CASES.values():
        if call is CASES["fastsoftmax bf16->fp32"]:
            continue
        call(x).float().sum().backward()
    assert len(launch_module._COMPILED) >= len(CASES) - 1
    assert all(entry[2] is not None for entry in launch_module._COMPILED.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("weight_layout", ["contiguous", "strided"])
def test_fastlayernorm_direct_eager_path_matches_the_op_bit_for_bit(dtype, weight_layout, monkeypatch):
    """The eager call that skips the dispatcher (statistics in one allocation, backward without the op's checks,
    one reduction for dweight and dbias) gives the op's values and gradients exactly, a strided weight included."""
    from e2eprof.kernels.fastlayernorm import op as ln_op

    torch.manual_seed(0)
    x = torch.randn(4, 96, 768, device="cuda", dtype=dtype)
    base = torch.randn(768 * (2 if weight_layout == "strided" else 1), device="cuda")
    weight0 = base[::2] if weight_layout == "strided" else base
    bias0 = torch.randn(768, device="cuda")
    dy = torch.randn(4, 96, 768, device="cuda", dtype=dtype)

    def run():
        xs = x.clone().requires_grad_()
        w = weight0.detach().clone() if weight_layout == "contiguous" else base.detach().clone()[::2]
        w.requires_grad_()
        b = bias0.clone().requires_grad_()
        y = fastlayernorm(xs, 768, w, b, 1e-5)
        y.backward(dy)
        with torch.no_grad():
            y_nograd = fastlayernorm(x, 768, weight0, bias0, 1e-5)
        return y.detach(), y_nograd, xs.grad, w.grad, b.grad

    direct = run()
    monkeypatch.setattr(ln_op, "run_directly", lambda *tensors: False)  # everything through torch.ops
    through_op = run()
    for a, b in zip(direct, through_op):
        assert torch.equal(a, b)
    reference = ln_op.reference_layer_norm(x, 768, weight0, bias0, 1e-5)
    # bf16 keeps 8 significant bits, so its rounding error grows with the value: the bound is one bf16 ulp relative
    # (an absolute 3e-2 failed on the H100 for values near 8, whose half ulp is 2**-5).
    tolerance = {"rtol": 2 ** -7, "atol": 1e-3} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-4}
    assert torch.allclose(direct[1].double(), reference, **tolerance)
