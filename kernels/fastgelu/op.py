"""Named custom ops `e2eprof::fastgelu` and `e2eprof::fastgelu_backward`, with dispatch and autograd.

Both GELUs share the ops, told apart by an `approximate` argument as in torch.nn.functional.gelu: "tanh" (GPT-2's
gelu_new, the default here, as this op began as that) or "none" (the exact erf GELU, BERT's). One op pair keeps the
dispatch, layout and autograd code in one place; the device kernels keep distinct names (_gelu_fwd_tanh, _gelu_fwd_erf)
so a profile still says which one ran.

Named ops (not a bare autograd.Function) so profiler traces, opcheck and torch.compile see one opaque op per call;
registered through torch.library.Library, with an autograd.Function as the op's Autograd kernel, because
torch.library.custom_op's per-call Python layers cost more host time than a small GELU (see _LIB below).
Dispatch: CUDA tensors run the Triton kernels; CPU tensors run cpu.py unless E2EPROF_FASTGELU_IMPL=triton forces
the Triton kernels (meaningful only under TRITON_INTERPRET=1; used by tests). There is deliberately no fallback to
the stock GELU: a patch that silently runs the stock op is exactly what e2eprof must catch, so a missing
implementation raises instead. IMPL_CALLS counts which implementation ran, for the report.

Layout: the output has the strides the stock elementwise chain would give (a dense input keeps its strides, any
other input gets a dense layout in the same dimension order), because e2eprof's op check compares strides. Both
implementations work on that layout's memory as one flat array.
"""

import collections
import functools
from typing import Optional

import torch

from .._dispatch import (TRITON_AVAILABLE, check_float, choose_impl, register_kernels, run_directly,
                         triton_kernels)
from . import cpu
from .cpu import APPROXIMATIONS

IMPL_ENV = "E2EPROF_FASTGELU_IMPL"

# Keys "triton.fwd", "triton.bwd", "cpu.fwd", "cpu.bwd": one per call that reached an implementation
# (empty inputs included: the implementation is chosen and called, it just launches nothing).
IMPL_CALLS: collections.Counter = collections.Counter()
_FWD_KEY = {"triton": "triton.fwd", "cpu": "cpu.fwd"}  # built once, not an f-string per call
_BWD_KEY = {"triton": "triton.bwd", "cpu": "cpu.bwd"}


def _choose_impl(t: torch.Tensor) -> str:
    """Pick "triton" or "cpu" for tensor `t`, or raise: never a silent fallback to the stock op."""
    return choose_impl(t, op="fastgelu", env_var=IMPL_ENV, stock="the stock GELU", triton_available=TRITON_AVAILABLE)


_check_float = functools.partial(check_float, "fastgelu")  # a TypeError naming e2eprof::fastgelu


def _check_approximate(approximate: str) -> None:
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"e2eprof::fastgelu: approximate must be one of {APPROXIMATIONS}, got {approximate!r}")


def _stock_strides(t: torch.Tensor) -> tuple[int, ...]:
    """The strides torch's elementwise ops give a new result computed from `t`."""
    return _elementwise_strides(tuple(t.shape), t.stride())


@functools.lru_cache(maxsize=256)
def _elementwise_strides(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    # Asked of TensorIterator itself, on the meta device (no data, no allocation), rather than re-derived: its rules
    # for permuted, sliced, expanded and odd size-1 strides are subtle. Cached: a model repeats a few layouts, and
    # this runs on every call.
    return torch.neg(torch.empty_strided(shape, strides, device="meta")).stride()


def _flat_in(t: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
    """`t`'s memory as a 1-D contiguous tensor in the dense layout `strides` (copies only if t is not already so)."""
    if t.stride() != strides:
        t = torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device).copy_(t)
    # Dense strides cover exactly numel consecutive elements from the storage offset, in memory order.
    return t.as_strided((t.numel(),), (1,))


# Registered with torch.library.Library rather than torch.library.custom_op, as fastsoftmax is (see its op.py):
# custom_op's per-call Python layers (a generic autograd kernel, a backend wrapper that checks aliasing,
# dynamo-disabling wrappers) cost more host time than a small GELU. Ops, schemas, fake kernels and autograd stay the
# same, so traces, opcheck and torch.compile see the same two named ops. One difference: a double backward now raises
# when the first backward is taken with create_graph=True, not later when the second one runs.
_LIB = torch.library.Library("e2eprof", "FRAGMENT")  # kept alive for the registrations' lifetime
_LIB.define('fastgelu(Tensor x, ScalarType? out_dtype, str approximate="tanh") -> Tensor')
_LIB.define('fastgelu_backward(Tensor grad_out, Tensor x, ScalarType dx_dtype, str approximate="tanh") -> Tensor')
_FWD_OP = torch.ops.e2eprof.fastgelu.default  # looked up once, not through torch.ops on every call
_BWD_OP = torch.ops.e2eprof.fastgelu_backward.default
# The kernels below keep approximate's default: the dispatcher leaves out an argument equal to its schema default when it
# calls a Python kernel, so "tanh" arrives as no argument at all.


def _fastgelu_impl(x: torch.Tensor, out_dtype: Optional[torch.dtype], approximate: str = "tanh") -> torch.Tensor:
    out_dtype = x.dtype if out_dtype is None else out_dtype
    _check_float("x", x.dtype)
    _check_float("out_dtype", out_dtype)
    _check_approximate(approximate)
    if x.is_cuda and TRITON_AVAILABLE and x.is_contiguous():
        # Contiguous on the GPU: the stock op's output is contiguous too, and the kernel walks the memory flat.
        y = triton_kernels(__package__).gelu_forward(x, out_dtype, approximate)
        IMPL_CALLS["triton.fwd"] += 1
        return y
    impl = _choose_impl(x)
    strides = _stock_strides(x)
    x1d = _flat_in(x, strides)  # (N,)
    if impl == "triton":
        y1d = triton_kernels(__package__).gelu_forward(x1d, out_dtype, approximate)
    else:
        y1d = cpu.gelu_forward(x1d, out_dtype, approximate)
    IMPL_CALLS[_FWD_KEY[impl]] += 1
    return y1d.as_strided(x.shape, strides)


def _fastgelu_fake(x: torch.Tensor, out_dtype: Optional[torch.dtype], approximate: str = "tanh") -> torch.Tensor:
    out_dtype = x.dtype if out_dtype is None else out_dtype
    _check_float("x", x.dtype)
    _check_float("out_dtype", out_dtype)
    _check_approximate(approximate)
    return torch.neg(x).to(out_dtype)  # metadata only: an elementwise op's result layout, as the real op returns


def _fastgelu_backward_impl(grad_out: torch.Tensor, x: torch.Tensor, dx_dtype: torch.dtype,
                            approximate: str = "tanh") -> torch.Tensor:
    _check_backward_args(grad_out, x, dx_dtype, approximate)
    if x.is_cuda and TRITON_AVAILABLE and x.is_contiguous() and grad_out.is_contiguous():
        dx = triton_kernels(__package__).gelu_backward(grad_out, x, dx_dtype, approximate)
        IMPL_CALLS["triton.bwd"] += 1
        return dx
    impl = _choose_impl(x)
    strides = _stock_strides(x)
    dy1d = _flat_in(grad_out, strides)  # (N,)
    x1d = _flat_in(x, strides)  # (N,)
    if impl == "triton":
        dx1d = triton_kernels(__package__).gelu_backward(dy1d, x1d, dx_dtype, approximate)
    else:
        dx1d = cpu.gelu_backward(dy1d, x1d, dx_dtype, approximate)
    IMPL_CALLS[_BWD_KEY[impl]] += 1
    return dx1d.as_strided(x.shape, strides)


def _fastgelu_backward_fake(grad_out: torch.Tensor, x: torch.Tensor, dx_dtype: torch.dtype,
                            approximate: str = "tanh") -> torch.Tensor:
    _check_backward_args(grad_out, x, dx_dtype, approximate)
    return torch.neg(x).to(dx_dtype)


def _check_backward_args(grad_out: torch.Tensor, x: torch.Tensor, dx_dtype: torch.dtype, approximate: str) -> None:
    if grad_out.shape != x.shape:
        raise ValueError(f"grad_out {tuple(grad_out.shape)} and x {tuple(x.shape)} must have the same shape")
    if grad_out.device != x.device:
        raise ValueError(f"grad_out on {grad_out.device} but x on {x.device}")
    _check_float("grad_out", grad_out.dtype)
    _check_float("x", x.dtype)
    _check_float("dx_dtype", dx_dtype)
    _check_approximate(approximate)


# The Autograd kernels redispatch below autograd (not a second torch.ops call), so a profile shows one
# e2eprof::fastgelu event per call, as with custom_op.
_BELOW_AUTOGRAD = torch._C._after_autograd_keyset


class _FastGELUFunction(torch.autograd.Function):
    """The Autograd kernel of e2eprof::fastgelu: runs the op below autograd and records its backward. With keyset None,
    an eager call that skips the dispatcher (run_directly), as fastsoftmax's."""

    @staticmethod
    def forward(ctx, keyset, x: torch.Tensor, out_dtype: Optional[torch.dtype], approximate: str) -> torch.Tensor:
        # Backward recomputes GELU'(x) from x: saving x (not intermediates) is what keeps the activation memory at one
        # tensor, where the stock chain keeps several.
        ctx.save_for_backward(x)
        ctx.approximate = approximate
        if keyset is None:
            return _fastgelu_impl(x, out_dtype, approximate)
        return _FWD_OP.redispatch(keyset, x, out_dtype, approximate)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (x,) = ctx.saved_tensors
        if not torch.is_grad_enabled() and run_directly(grad_out):
            return None, _fastgelu_backward_impl(grad_out, x, x.dtype, ctx.approximate), None, None
        return None, _BWD_OP(grad_out, x, x.dtype, ctx.approximate), None, None


def _fastgelu_autograd(keyset, x: torch.Tensor, out_dtype: Optional[torch.dtype],
                       approximate: str = "tanh") -> torch.Tensor:
    below = keyset & _BELOW_AUTOGRAD
    if torch.is_grad_enabled() and x.requires_grad:
        return _FastGELUFunction.apply(below, x, out_dtype, approximate)
    return _FWD_OP.redispatch(below, x, out_dtype, approximate)


def _fastgelu_backward_autograd(keyset, grad_out: torch.Tensor, x: torch.Tensor, dx_dtype: torch.dtype,
                                approximate: str = "tanh") -> torch.Tensor:
    # No double backward: refuse rather than let autograd treat the gradient as a constant without a word.
    if torch.is_grad_enabled() and (grad_out.requires_grad or x.requires_grad):
        raise RuntimeError("e2eprof::fastgelu_backward is not differentiable (no double backward through fastgelu)")
    return _BWD_OP.redispatch(keyset & _BELOW_AUTOGRAD, grad_out, x, dx_dtype, approximate)


register_kernels(_LIB, "fastgelu", impl=_fastgelu_impl, autograd=_fastgelu_autograd, fake=_fastgelu_fake)
register_kernels(_LIB, "fastgelu_backward", impl=_fastgelu_backward_impl,
                 autograd=_fastgelu_backward_autograd, fake=_fastgelu_backward_fake)


def fastgelu(x: torch.Tensor, out_dtype: Optional[torch.dtype] = None, approximate: str = "tanh") -> torch.Tensor:
    """GELU of `x`, written as `out_dtype` (default: x.dtype).

    approximate: "tanh" (transformers' `gelu_new`, GPT-2's) or "none" (the exact erf GELU, transformers' `gelu`,
    BERT's), as in torch.nn.functional.gelu; the default is "tanh", not torch's "none".

    Calls `torch.ops.e2eprof.fastgelu`: reads x in its own dtype, computes in fp32 (fp64 for fp64 input on the CPU
    implementation). Differentiable; the gradient has x's dtype. The result has the layout the stock op would give.
    """
    if run_directly(x):
        if torch.is_grad_enabled() and x.requires_grad:
            return _FastGELUFunction.apply(None, x, out_dtype, approximate)
        return _fastgelu_impl(x, out_dtype, approximate)
    return _FWD_OP(x, out_dtype, approximate)  # torch.ops.e2eprof.fastgelu.default, bound once


def reference_gelu(x: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """Trusted fp64 reference: torch's own GELU on x.double(), returned as float64.

    torch.nn.functional.gelu is an implementation independent of ours and of the transformers code being replaced
    (for "tanh" a chain of elementwise ops), with the same formula. Differentiable, so it also gives fp64 reference
    gradients.
    """
    _check_approximate(approximate)
    return torch.nn.functional.gelu(x.double(), approximate=approximate)
