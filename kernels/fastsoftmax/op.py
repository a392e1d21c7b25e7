"""Named custom ops `e2eprof::fastsoftmax` and `e2eprof::fastsoftmax_backward`, with dispatch and autograd.

Named ops (not a bare autograd.Function) so profiler traces, opcheck and torch.compile see one opaque op per call;
registered through torch.library.Library, with an autograd.Function as the op's Autograd kernel, because
torch.library.custom_op's per-call Python layers cost more host time than a small softmax (see _LIB below).
Dispatch: CUDA tensors run the Triton kernels; CPU tensors run cpu.py unless E2EPROF_FASTSOFTMAX_IMPL=triton
forces the Triton kernels (meaningful only under TRITON_INTERPRET=1; used by tests). There is deliberately no
fallback to torch's softmax: a patch that silently runs the stock op is exactly what e2eprof must catch, so a missing
implementation raises instead. IMPL_CALLS counts which implementation ran, for the report.

dtype arguments: torch.library accepts `torch.dtype` as the schema type `ScalarType` on torch >= 2.4 (checked on
2.11 and 2.13), so dtypes are passed as plain `torch.dtype`, no encoding needed.
"""

import collections
import functools
import math
from typing import Optional

import torch

from .._dispatch import (TRITON_AVAILABLE, check_float, choose_impl, register_kernels, run_directly,
                         triton_kernels)
from . import cpu

IMPL_ENV = "E2EPROF_FASTSOFTMAX_IMPL"

# Keys "triton.fwd", "triton.bwd", "cpu.fwd", "cpu.bwd": one per call that reached an implementation
# (empty inputs included: the implementation is chosen and called, it just launches nothing).
IMPL_CALLS: collections.Counter = collections.Counter()
_FWD_KEY = {"triton": "triton.fwd", "cpu": "cpu.fwd"}  # built once, not an f-string per call
_BWD_KEY = {"triton": "triton.bwd", "cpu": "cpu.bwd"}


def _choose_impl(t: torch.Tensor) -> str:
    """Pick "triton" or "cpu" for tensor `t`, or raise: never a silent fallback to the stock op."""
    return choose_impl(t, op="fastsoftmax", env_var=IMPL_ENV, stock="torch.softmax", triton_available=TRITON_AVAILABLE)


def _normalize_dim(dim: int, ndim: int) -> int:
    n = max(ndim, 1)  # a 0-d tensor softmaxes over dim 0 or -1, like torch
    if not -n <= dim < n:
        raise IndexError(f"dim {dim} out of range for a tensor of {ndim} dims")
    return dim % n


_check_float = functools.partial(check_float, "fastsoftmax")  # a TypeError naming e2eprof::fastsoftmax


def _to_rows(t: torch.Tensor, dim: int) -> torch.Tensor:
    """View `t` as a contiguous [rows, cols] matrix with `dim` as the columns (copies only if needed)."""
    if t.dim() == 0:
        return t.reshape(1, 1)
    if dim != t.dim() - 1 or not t.is_contiguous():  # the common case (scores, last dim) skips both calls
        t = t.movedim(dim, -1).contiguous()  # (..., C)
    return t.view(math.prod(t.shape[:-1]), t.shape[-1])  # (R, C); rows not numel // C: C may be 0


def _from_rows(y2d: torch.Tensor, shape: torch.Size, dim: int) -> torch.Tensor:
    """Inverse of _to_rows: a new tensor of `shape`, contiguous in the original layout (as torch.softmax returns)."""
    if len(shape) == 0:
        return y2d.reshape(())
    if dim == len(shape) - 1:
        return y2d.view(shape)  # y2d is fresh and contiguous: already in the original layout
    moved = list(shape)
    moved.append(moved.pop(dim))
    y = y2d.view(moved)  # (..., C), a view of the fresh y2d with standard strides
    out = torch.empty(shape, dtype=y2d.dtype, device=y2d.device)
    out.movedim(dim, -1).copy_(y)
    return out


# Registered with torch.library.Library rather than torch.library.custom_op: custom_op wraps every call in Python
# layers (a generic autograd kernel, a backend wrapper that checks aliasing, dynamo-disabling wrappers) that cost
# more host time per call than the work of a small softmax. Here the dispatcher calls our own autograd kernel, which
# redispatches straight to the implementation; the ops, their schemas, fake kernels and autograd are the same, so
# traces, opcheck and torch.compile see the same two named ops. On a 1x2x4x4 CPU tensor this cut about 20-25% of
# fastsoftmax's host time per call (benchmarks/host_overhead.py). One difference: a double backward now raises
# when the first backward is taken with create_graph=True, not later when the second one runs.
_LIB = torch.library.Library("e2eprof", "FRAGMENT")  # kept alive for the registrations' lifetime
_LIB.define("fastsoftmax(Tensor x, int dim, ScalarType? out_dtype) -> Tensor")
_LIB.define("fastsoftmax_backward(Tensor grad_out, Tensor out, int dim, ScalarType in_dtype) -> Tensor")


def _fastsoftmax_impl(x: torch.Tensor, dim: int, out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    out_dtype = x.dtype if out_dtype is None else out_dtype
    _check_float("x", x.dtype)
    _check_float("out_dtype", out_dtype)
    dim = _normalize_dim(dim, x.dim())
    if x.is_cuda and TRITON_AVAILABLE and dim == x.dim() - 1 and x.is_contiguous():
        # Attention scores on the GPU: the rows are the last dim already, so no view or copy on the host.
        y = triton_kernels(__package__).softmax_forward(x, out_dtype)
        IMPL_CALLS["triton.fwd"] += 1
        return y
    impl = _choose_impl(x)
    x2d = _to_rows(x, dim)  # (R, C)
    if impl == "triton":
        y2d = triton_kernels(__package__).softmax_forward(x2d, out_dtype)
    else:
        y2d = cpu.softmax_forward(x2d, out_dtype)
    IMPL_CALLS[_FWD_KEY[impl]] += 1
    return _from_rows(y2d, x.shape, dim)


def _fastsoftmax_fake(x: torch.Tensor, dim: int, out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    out_dtype = x.dtype if out_dtype is None else out_dtype
    _check_float("x", x.dtype)
    _check_float("out_dtype", out_dtype)
    _normalize_dim(dim, x.dim())
    return x.new_empty(x.shape, dtype=out_dtype)


def _fastsoftmax_backward_impl(
    grad_out: torch.Tensor, out: torch.Tensor, dim: int, in_dtype: torch.dtype
) -> torch.Tensor:
    _check_backward_args(grad_out, out, in_dtype)
    dim = _normalize_dim(dim, out.dim())
    if out.is_cuda and TRITON_AVAILABLE and dim == out.dim() - 1 and out.is_contiguous() and grad_out.is_contiguous():
        # Rows along the last dim: no view or copy on the host.
        dx = triton_kernels(__package__).softmax_backward(grad_out, out, in_dtype)
        IMPL_CALLS["triton.bwd"] += 1
        return dx
    impl = _choose_impl(out)
    dy2d = _to_rows(grad_out, dim)  # (R, C)
    y2d = _to_rows(out, dim)  # (R, C)
    if impl == "triton":
        dx2d = triton_kernels(__package__).softmax_backward(dy2d, y2d, in_dtype)
    else:
        dx2d = cpu.softmax_backward(dy2d, y2d, in_dtype)
    IMPL_CALLS[_BWD_KEY[impl]] += 1
    return _from_rows(dx2d, out.shape, dim)


def _fastsoftmax_backward_fake(
    grad_out: torch.Tensor, out: torch.Tensor, dim: int, in_dtype: torch.dtype
) -> torch.Tensor:
    _check_backward_args(grad_out, out, in_dtype)
    _normalize_dim(dim, out.dim())
    return out.new_empty(out.shape, dtype=in_dtype)


def _check_backward_args(grad_out: torch.Tensor, out: torch.Tensor, in_dtype: torch.dtype) -> None:
    if grad_out.shape != out.shape:
        raise ValueError(f"grad_out {tuple(grad_out.shape)} and out {tuple(out.shape)} must have the same shape")
    if grad_out.device != out.device:
        raise ValueError(f"grad_out on {grad_out.device} but out on {out.device}")
    _check_float("grad_out", grad_out.dtype)
    _check_float("out", out.dtype)
    _check_float("in_dtype", in_dtype)


# The Autograd kernels below hand the call on with `redispatch` on the key set below autograd, as torch.library's
# custom_op does: a second `torch.ops.e2eprof.fastsoftmax(...)` call would go through the dispatcher's profiling
# hook again, and every forward would show in profiles as two nested e2eprof::fastsoftmax events (twice the calls
# in ops.parquet and the op diff).
_BELOW_AUTOGRAD = torch._C._after_autograd_keyset


class _FastSoftmaxFunction(torch.autograd.Function):
    """The Autograd kernel of e2eprof::fastsoftmax: runs the op below autograd and records its backward. With keyset
    None, an eager call that skips the dispatcher (run_directly): the implementation runs directly, and so does
    the backward unless something needs the op (create_graph, a mode, a profiler)."""

    @staticmethod
    def forward(ctx, keyset, x: torch.Tensor, dim: int, out_dtype: Optional[torch.dtype]) -> torch.Tensor:
        y = (_fastsoftmax_impl(x, dim, out_dtype) if keyset is None
             else torch.ops.e2eprof.fastsoftmax.default.redispatch(keyset, x, dim, out_dtype))
        # Backward needs only y (dx = y * (dy - sum(dy * y))), so x is not kept alive.
        ctx.save_for_backward(y)
        ctx.dim = dim
        ctx.in_dtype = x.dtype  # the gradient has the input's dtype, as for torch.softmax(x, dtype=...)
        return y

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (y,) = ctx.saved_tensors
        if not torch.is_grad_enabled() and run_directly(grad_out):
            return None, _fastsoftmax_backward_impl(grad_out, y, ctx.dim, ctx.in_dtype), None, None
        return None, torch.ops.e2eprof.fastsoftmax_backward.default(grad_out, y, ctx.dim, ctx.in_dtype), None, None


def _fastsoftmax_autograd(keyset, x: torch.Tensor, dim: int, out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    below = keyset & _BELOW_AUTOGRAD
    if torch.is_grad_enabled() and x.requires_grad:
        return _FastSoftmaxFunction.apply(below, x, dim, out_dtype)
    return torch.ops.e2eprof.fastsoftmax.default.redispatch(below, x, dim, out_dtype)


def _fastsoftmax_backward_autograd(
    keyset, grad_out: torch.Tensor, out: torch.Tensor, dim: int, in_dtype: torch.dtype
) -> torch.Tensor:
    # No double backward: refuse rather than let autograd treat the gradient as a constant without a word.
    if torch.is_grad_enabled() and (grad_out.requires_grad or out.requires_grad):
        raise RuntimeError("e2eprof::fastsoftmax_backward is not differentiable (no double backward through fastsoftmax)")
    return torch.ops.e2eprof.fastsoftmax_backward.default.redispatch(keyset & _BELOW_AUTOGRAD, grad_out, out, dim,
                                                                   in_dtype)


register_kernels(_LIB, "fastsoftmax", impl=_fastsoftmax_impl, autograd=_fastsoftmax_autograd, fake=_fastsoftmax_fake)
register_kernels(_LIB, "fastsoftmax_backward", impl=_fastsoftmax_backward_impl,
                 autograd=_fastsoftmax_backward_autograd, fake=_fastsoftmax_backward_fake)


def fastsoftmax(x: torch.Tensor, dim: int = -1, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Softmax of `x` along `dim`, written as `out_dtype` (default: x.dtype), via `torch.ops.e2eprof.fastsoftmax`.

    Reads x in its own dtype and accumulates in fp32 (fp64 for fp64 input on the CPU implementation), so
    `fastsoftmax(scores_bf16, out_dtype=torch.float32)` replaces autocast's cast-then-softmax with one pass.
    Differentiable; the gradient has x's dtype. The result is a new tensor, contiguous in x's layout.
    """
    if run_directly(x):
        if torch.is_grad_enabled() and x.requires_grad:
            return _FastSoftmaxFunction.apply(None, x, dim, out_dtype)
        return _fastsoftmax_impl(x, dim, out_dtype)
    return torch.ops.e2eprof.fastsoftmax(x, dim, out_dtype)


def reference_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Trusted fp64 reference: softmax of x.double() along `dim`, returned as float64.

    Uses torch.softmax on float64 on purpose: it is the yardstick the kernels are measured against, not a kernel.
    Same -inf semantics (an all -inf row is NaN). Differentiable, so it also gives fp64 reference gradients.
    """
    return torch.softmax(x.double(), dim=dim)
