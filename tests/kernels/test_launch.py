"""The two host-time savings of the built-in kernels, checked on the CPU.

kernels/_launch.py launches a compiled Triton kernel directly only for calls that name every parameter in the
kernel's order: every built-in call site must, or the saving silently never applies on a GPU (the direct launches
themselves need CUDA: tests/gpu/test_launch_cuda.py). kernels/_dispatch.py's run_directly lets an eager call skip the
dispatcher, and only where nothing can tell: these tests check when it says yes, that the public functions then skip
the op, and that both paths give the same values and gradients bit for bit.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode

import e2eprof.kernels._launch as launch_module
import e2eprof.kernels.fastgelu.op as gelu_op
import e2eprof.kernels.fastlayernorm.op as layernorm_op
import e2eprof.kernels.fastsoftmax.op as softmax_op
import e2eprof.kernels.fusedsoftmax.op as fused_op
import e2eprof.kernels.rmsnorm.op as rmsnorm_op
import e2eprof.kernels.swiglu.op as swiglu_op
from e2eprof.kernels._dispatch import TRITON_AVAILABLE, run_directly, triton_kernels

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(not (TRITON_AVAILABLE and _INTERPRET),
                                       reason="needs triton and TRITON_INTERPRET=1")
OPS = [softmax_op, fused_op, gelu_op, layernorm_op, rmsnorm_op, swiglu_op]


def _cases(op_module) -> list[tuple]:
    """(call, input shapes) for each variant of the op's public function; call takes the inputs positionally."""
    if op_module is softmax_op:
        return [(softmax_op.fastsoftmax, [(2, 3, 20)]), (lambda x: softmax_op.fastsoftmax(x, dim=0), [(4, 5)])]
    if op_module is fused_op:
        mask = torch.zeros(1, 1, 3, 20)
        mask[..., -3:] = float("-inf")
        return [(lambda s: fused_op.fusedsoftmax(s, mask, 0.5), [(1, 2, 3, 20)]),
                (fused_op.fusedsoftmax, [(1, 2, 3, 8)])]
    if op_module is gelu_op:
        return [(gelu_op.fastgelu, [(4, 40)]), (lambda x: gelu_op.fastgelu(x, approximate="none"), [(4, 40)])]
    if op_module is layernorm_op:
        return [(lambda x, w, b: layernorm_op.fastlayernorm(x, 20, w, b), [(3, 20), (20,), (20,)]),
                (lambda x: layernorm_op.fastlayernorm(x, 8), [(3, 8)])]
    if op_module is rmsnorm_op:
        return [(lambda x, w: rmsnorm_op.rmsnorm(x, w, 1e-6), [(3, 20), (20,)])]
    return [(swiglu_op.swiglu, [(3, 20), (3, 20)])]


def _inputs(shapes: list[tuple], requires_grad: bool) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=g).requires_grad_(requires_grad) for shape in shapes]


def _values_and_grads(op_module) -> list[torch.Tensor]:
    """Each variant without grad, then with grad: its output and every input's gradient of a weighted sum (a plain
    sum's softmax gradient is zero)."""
    out = []
    for call, shapes in _cases(op_module):
        with torch.no_grad():
            out.append(call(*_inputs(shapes, False)))
        inputs = _inputs(shapes, True)
        y = call(*inputs)
        weights = torch.linspace(-1, 1, y.numel()).reshape(y.shape)
        out += [y.detach(), *torch.autograd.grad((y * weights).sum(), inputs)]
    return out


@needs_interpreter
@pytest.mark.parametrize("op_module", OPS, ids=lambda m: m.__package__.rsplit(".", 1)[-1])
def test_every_triton_launch_names_every_parameter_in_order(op_module, monkeypatch):
    monkeypatch.setenv(op_module.IMPL_ENV, "triton")
    kernels = triton_kernels(op_module.__package__)
    for name in ("MAX_FUSED_COLS_FWD", "MAX_FUSED_COLS_BWD"):  # small limits: 20 columns loop, 8 fit a row
        if hasattr(kernels, name):
            monkeypatch.setattr(kernels, name, 16)
    seen = set()
    real = launch_module.launch

    def recording(kernel, grid, *args, **constexprs):
        assert launch_module.names_every_parameter(kernel, len(args), constexprs), (kernel, len(args), constexprs)
        seen.add(kernel)
        real(kernel, grid, *args, **constexprs)

    monkeypatch.setattr(kernels, "launch", recording)
    _values_and_grads(op_module)
    defined = {v for k, v in vars(kernels).items() if k.endswith("_kernel") and hasattr(v, "arg_names")}
    assert seen == defined  # every kernel of the module went through launch, forward and backward


def test_names_every_parameter_refuses_a_partial_or_reordered_call():
    class Kernel:
        arg_names = ["x_ptr", "n", "HAS_W", "BLOCK"]

    assert launch_module.names_every_parameter(Kernel, 2, {"HAS_W": True, "BLOCK": 64, "num_warps": 4})
    assert not launch_module.names_every_parameter(Kernel, 2, {"BLOCK": 64, "HAS_W": True})  # reordered
    assert not launch_module.names_every_parameter(Kernel, 2, {"BLOCK": 64})  # HAS_W left to a default
    assert not launch_module.names_every_parameter(Kernel, 1, {"HAS_W": True, "BLOCK": 64})  # n missing


@needs_interpreter
def test_the_triton_softmax_takes_rows_along_the_last_dim_of_any_shape():
    kernels = triton_kernels(softmax_op.__package__)
    x = torch.randn(2, 3, 5, 7)
    y = kernels.softmax_forward(x, torch.float32)
    assert y.shape == x.shape and y.is_contiguous()
    torch.testing.assert_close(y, torch.softmax(x, -1), rtol=1e-6, atol=1e-6)
    dy = torch.randn_like(x)
    expected = y * (dy - (dy * y).sum(-1, keepdim=True))
    torch.testing.assert_close(kernels.softmax_backward(dy, y, torch.float32), expected, rtol=1e-5, atol=1e-6)
    assert kernels.softmax_forward(torch.empty(2, 0), torch.float32).shape == (2, 0)
    with pytest.raises(ValueError, match="contiguous"):
        kernels.softmax_forward(x.transpose(1, 2), torch.float32)


@needs_interpreter
def test_the_triton_layernorm_takes_rows_along_the_last_dim_of_any_shape():
    kernels = triton_kernels(layernorm_op.__package__)
    x, w, b = torch.randn(2, 3, 20), torch.randn(20), torch.randn(20)
    y, mean, rstd = kernels.layer_norm_forward(x, w, b, 1e-5, torch.float32)
    assert y.shape == x.shape and y.is_contiguous() and mean.shape == rstd.shape == (2, 3)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (20,), w, b), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mean, x.mean(-1))
    dy = torch.randn_like(x)
    dx, dw, db = kernels.layer_norm_backward(dy, x, mean, rstd, w, torch.float32, torch.float32, torch.float32)
    flat = kernels.layer_norm_backward(dy.view(6, 20), x.view(6, 20), mean.view(6), rstd.view(6), w, torch.float32,
                                       torch.float32, torch.float32)
    assert dx.shape == x.shape
    for got, expected in zip((dx.view(6, 20), dw, db), flat):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)  # the same programs over the same memory
    _, mean1, _ = kernels.layer_norm_forward(torch.randn(20), None, None, 1e-5, torch.float32)
    assert mean1.shape == ()  # one row: 0-d statistics, as the op's
    with pytest.raises(ValueError, match="contiguous"):
        kernels.layer_norm_forward(x.transpose(0, 1), w, b, 1e-5, torch.float32)


@needs_interpreter
@pytest.mark.parametrize("cols", [20, 4099], ids=["row-kernels", "looped-kernels"])
def test_packed_layernorm_statistics_match_separate_ones_bit_for_bit(cols, monkeypatch):
    """The eager call's forward keeps mean and rstd in one [2, *batch] tensor (rstd None) and its backward reads them
    back from there: the same values, and the same gradients, as two statistics tensors."""
    kernels = triton_kernels(layernorm_op.__package__)
    monkeypatch.setattr(kernels, "MAX_FUSED_COLS_FWD", 64)  # 4099 columns take the looped kernels, with fewer lanes
    monkeypatch.setattr(kernels, "MAX_FUSED_COLS_BWD", 64)
    monkeypatch.setattr(kernels, "LOOP_BLOCK", 1024)
    gen = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(shape, generator=gen) for shape in ((2, 3, cols), (cols,), (cols,)))
    y, mean, rstd = kernels.layer_norm_forward(x, w, b, 1e-5, torch.float32)
    y_packed, stats, none = kernels.layer_norm_forward(x, w, b, 1e-5, torch.float32, packed=True)
    assert none is None and stats.shape == (2, 2, 3) and stats.is_contiguous()
    torch.testing.assert_close(y_packed, y, rtol=0, atol=0)
    torch.testing.assert_close(stats, torch.stack((mean, rstd)), rtol=0, atol=0)
    dy = torch.randn(x.shape, generator=gen)
    separate = kernels.layer_norm_backward_unchecked(dy, x, mean, rstd, w, torch.float32, torch.float32, torch.float32)
    packed = kernels.layer_norm_backward_unchecked(dy, x, stats, None, w, torch.float32, torch.float32, torch.float32)
    for got, expected in zip(packed, separate):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(packed[0], torch.func.vjp(lambda t: torch.nn.functional.layer_norm(t, (cols,), w, b),
                                                         x)[1](dy)[0], rtol=1e-4, atol=1e-4)


@needs_interpreter
@pytest.mark.parametrize("shape,normalized_shape,view", [
    ((7,), [7], None), ((2, 3, 5), [5], None), ((2, 3, 4, 6), [4, 6], None), ((0, 8), [8], None),
    ((5, 0), [0], None), ((8, 5), [8], lambda t: t.t())],
    ids=["one-row", "3d", "two-dims", "empty", "zero-width", "transposed"])
def test_the_triton_layernorm_route_gives_the_op_its_shapes(shape, normalized_shape, view, monkeypatch):
    """The Triton route returns the statistics straight from the launcher (no reshape on the common call): their
    shapes must still be the batch shape the fake kernel promises, for every route through the implementation."""
    monkeypatch.setenv(layernorm_op.IMPL_ENV, "triton")
    x = torch.randn(shape)
    x = view(x) if view else x
    w = torch.randn(normalized_shape)
    y, mean, rstd = torch.ops.e2eprof.fastlayernorm(x, normalized_shape, w, None, 1e-5, None)
    fake = layernorm_op._fastlayernorm_fake(x, normalized_shape, w, None, 1e-5, None)
    assert [(t.shape, t.dtype) for t in (y, mean, rstd)] == [(t.shape, t.dtype) for t in fake]
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, normalized_shape, w), rtol=1e-5, atol=1e-5)
    grads = torch.ops.e2eprof.fastlayernorm_backward(torch.ones_like(y), x, mean, rstd, normalized_shape, w,
                                                     torch.float32, torch.float32, torch.float32)
    assert [g.shape for g in grads] == [x.shape, w.shape, w.shape]


@needs_interpreter
def test_the_triton_swiglu_walks_any_contiguous_shape_flat():
    kernels = triton_kernels(swiglu_op.__package__)
    gate, up = torch.randn(2, 3, 50), torch.randn(2, 3, 50)
    y = kernels.swiglu_forward(gate, up)
    assert y.shape == gate.shape
    torch.testing.assert_close(y, torch.nn.functional.silu(gate) * up, rtol=1e-5, atol=1e-6)
    dgate, dup = kernels.swiglu_backward(torch.ones_like(y), gate, up)
    assert dgate.shape == dup.shape == gate.shape
    torch.testing.assert_close(dup, torch.nn.functional.silu(gate), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="contiguous"):
        kernels.swiglu_forward(gate.transpose(0, 1), up.transpose(0, 1))


@needs_interpreter
def test_the_triton_gelu_walks_any_contiguous_shape_flat():
    kernels = triton_kernels(gelu_op.__package__)
    x = torch.randn(2, 3, 50)
    y = kernels.gelu_forward(x, torch.float32, "tanh")
    assert y.shape == x.shape
    torch.testing.assert_close(y, torch.nn.functional.gelu(x, approximate="tanh"), rtol=1e-5, atol=1e-6)
    assert kernels.gelu_backward(torch.ones_like(x), x, torch.float32, "none").shape == x.shape
    with pytest.raises(ValueError, match="contiguous"):
        kernels.gelu_forward(x.transpose(0, 1), torch.float32, "tanh")


def test_run_directly_only_for_plain_eager_calls():
    x = torch.randn(3)
    assert run_directly(x, None, torch.nn.Parameter(torch.randn(3)))
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(x)
        assert not run_directly(fake)
    assert not run_directly(fake)  # a fake tensor is a subclass: it may want the op even outside its mode

    class Watching(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Watching():
        assert not run_directly(x)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert not run_directly(x)  # the profile must show the named op
    assert torch.vmap(lambda row: torch.tensor(run_directly(row)))(torch.randn(2, 3)).tolist() == [False, False]
    assert torch.compile(lambda t: t + run_directly(t), backend="eager", fullgraph=True)(x).equal(x)  # traced: False
    assert run_directly(x)


def _spy_on_impl(op_module, monkeypatch) -> list:
    """Replace the module's forward implementation as the public function sees it; the registered op keeps the
    original, so a call that reaches the spy skipped the dispatcher."""
    name = "_" + op_module.__package__.rsplit(".", 1)[-1] + "_impl"  # e.g. _fastsoftmax_impl
    real, calls = getattr(op_module, name), []

    def spy(*args, **kwargs):
        calls.append(name)
        return real(*args, **kwargs)

    monkeypatch.setattr(op_module, name, spy)
    return calls


@pytest.mark.parametrize("op_module", OPS, ids=lambda m: m.__package__.rsplit(".", 1)[-1])
def test_eager_calls_skip_the_dispatcher_and_match_the_op_bit_for_bit(op_module, monkeypatch):
    reached = _spy_on_impl(op_module, monkeypatch)
    direct = _values_and_grads(op_module)
    assert len(reached) == 2 * len(_cases(op_module))  # every eager call, with grad and without, skipped the op
    monkeypatch.setattr(op_module, "run_directly", lambda *tensors: False)  # now everything through torch.ops
    through_op = _values_and_grads(op_module)
    assert len(reached) == 2 * len(_cases(op_module))  # the registered op runs the original implementation
    assert len(direct) == len(through_op)
    for a, b in zip(direct, through_op):
        assert torch.equal(a, b)


def test_a_double_backward_is_still_refused_on_the_direct_path():
    x = torch.randn(3, 5, requires_grad=True)
    y = softmax_op.fastsoftmax(x)
    with pytest.raises(RuntimeError, match="not differentiable"):  # as through the op: at the first backward
        torch.autograd.grad((y * torch.linspace(-1, 1, 15).reshape(3, 5)).sum(), x, create_graph=True)


@pytest.mark.skipif(not TRITON_AVAILABLE, reason="needs triton")
def test_host_next_power_of_2_and_cdiv_equal_tritons():
    import triton

    for n in [*range(0, 4100), 65535, 65536, 65537, 2**31 - 1, 2**31, 2**40 + 3]:
        assert launch_module.next_power_of_2(n) == triton.next_power_of_2(n), n
    for a in [0, 1, 2, 63, 64, 65, 1000, 2**31 + 5]:
        for b in [1, 2, 3, 64, 1024]:
            assert launch_module.cdiv(a, b) == triton.cdiv(a, b), (a, b)
