"""Named custom ops `e2eprof::fastlayernorm` and `e2eprof::fastlayernorm_backward`, with dispatch and autograd.

Named ops (not a bare autograd.Function) so profiler traces, opcheck and torch.compile see one opaque op per call;
registered through torch.library.Library, with an autograd.Function as the op's Autograd kernel, because
torch.library.custom_op's per-call Python layers cost more host time than a small LayerNorm (see _LIB below).
Dispatch: CUDA tensors run the Triton kernels; CPU tensors run cpu.py unless E2EPROF_FASTLAYERNORM_IMPL=triton
forces the Triton kernels (meaningful only under TRITON_INTERPRET=1; used by tests). There is deliberately no
fallback to torch's layer_norm: a patch that silently runs the stock op is exactly what e2eprof must catch, so a
missing implementation raises instead. IMPL_CALLS counts which implementation ran, for the report.

The forward op returns (y, mean, rstd) like aten::native_layer_norm, so backward reuses the statistics instead of
re-reading x for them; mean and rstd are marked non-differentiable. Like torch's layer_norm, the output is
contiguous whatever the input's layout.
"""

import collections
import functools
import math
from collections.abc import Sequence
from typing import Optional

import torch

from .._dispatch import (TRITON_AVAILABLE, check_float, choose_impl, register_kernels, run_directly,
                         triton_kernels)
from . import cpu

IMPL_ENV = "E2EPROF_FASTLAYERNORM_IMPL"

# Keys "triton.fwd", "triton.bwd", "cpu.fwd", "cpu.bwd": one per call that reached an implementation
# (empty inputs included: the implementation is chosen and called, it just launches nothing).
IMPL_CALLS: collections.Counter = collections.Counter()
_BWD_KEY = {"triton": "triton.bwd", "cpu": "cpu.bwd"}


def _choose_impl(t: torch.Tensor) -> str:
    """Pick "triton" or "cpu" for tensor `t`, or raise: never a silent fallback to the stock op."""
    return choose_impl(t, op="fastlayernorm", env_var=IMPL_ENV, stock="torch's layer_norm", triton_available=TRITON_AVAILABLE)


_check_float = functools.partial(check_float, "fastlayernorm")  # a TypeError naming e2eprof::fastlayernorm


def _rows_cols(x: torch.Tensor, normalized_shape: Sequence[int], weight: Optional[torch.Tensor],
               bias: Optional[torch.Tensor]) -> tuple[int, int]:
    """Validate shapes as torch.layer_norm does; return (rows, cols) of x viewed as [rows, prod(normalized_shape)]."""
    k, ndim, shape = len(normalized_shape), x.dim(), tuple(normalized_shape)
    if k == 0 or ndim < k or x.shape[ndim - k:] != shape:
        raise ValueError(
            f"e2eprof::fastlayernorm: normalized_shape {list(normalized_shape)} must be non-empty and match the last "
            f"dims of x {list(x.shape)}"
        )
    device = x.device  # once: each .device builds a new torch.device
    for name, param in (("weight", weight), ("bias", bias)):
        if param is None:
            continue
        if param.shape != shape:
            raise ValueError(f"e2eprof::fastlayernorm: {name} shape {list(param.shape)} != normalized_shape "
                             f"{list(normalized_shape)}")
        if param.device != device:
            raise ValueError(f"e2eprof::fastlayernorm: {name} on {param.device} but x on {device}")
        _check_float(name, param.dtype)
    _check_float("x", x.dtype)
    cols = math.prod(normalized_shape)
    rows = math.prod(x.shape[: ndim - k])  # not numel // cols: cols may be 0
    return rows, cols


def _flat_param(param: Optional[torch.Tensor], cols: int) -> Optional[torch.Tensor]:
    # The common 1-D contiguous parameter goes as is (two aten calls fewer); the kernels only read it.
    if param is None or (param.dim() == 1 and param.is_contiguous()):
        return param
    return param.contiguous().reshape(cols)  # (C,)


def _stats_dtype(impl: str, *tensors: Optional[torch.Tensor]) -> torch.dtype:
    # The Triton kernels keep fp32 statistics; the CPU implementation keeps them in its compute dtype.
    return torch.float32 if impl == "triton" else cpu.compute_dtype(*tensors)


# Registered with torch.library.Library rather than torch.library.custom_op, as fastsoftmax is (see its op.py):
# custom_op's per-call Python layers cost more host time than a small LayerNorm; ops, schemas, fake kernels and
# autograd stay the same, so traces, opcheck and torch.compile see the same two named ops. They keep the
# pt2_compliant tag custom_op gave them. A double backward now raises when the first backward is taken with
# create_graph=True, not later when the second one runs.
_LIB = torch.library.Library("e2eprof", "FRAGMENT")  # kept alive for the registrations' lifetime
_LIB.define("fastlayernorm(Tensor x, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps, "
            "ScalarType? out_dtype) -> (Tensor, Tensor, Tensor)", tags=(torch.Tag.pt2_compliant_tag,))
_LIB.define("fastlayernorm_backward(Tensor grad_out, Tensor x, Tensor mean, Tensor rstd, int[] normalized_shape, "
            "Tensor? weight, ScalarType dx_dtype, ScalarType weight_dtype, ScalarType bias_dtype) "
            "-> (Tensor, Tensor, Tensor)", tags=(torch.Tag.pt2_compliant_tag,))


def _fastlayernorm_impl(x: torch.Tensor, normalized_shape: Sequence[int], weight: Optional[torch.Tensor],
                        bias: Optional[torch.Tensor], eps: float,
                        out_dtype: Optional[torch.dtype], packed: bool = False,
                        keep_stats: bool = True) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    # packed, keep_stats: the Triton launcher's (the statistics as one tensor and None where it can, see
    # layer_norm_forward; none at all, then None), for the direct call only: the op's outputs never alias and always
    # include the statistics.
    out_dtype = x.dtype if out_dtype is None else out_dtype
    _check_float("out_dtype", out_dtype)
    rows, cols = _rows_cols(x, normalized_shape, weight, bias)
    impl = _choose_impl(x)
    w, b = _flat_param(weight, cols), _flat_param(bias, cols)
    if impl == "triton":
        # The Triton launcher takes rows along the last dim of any contiguous shape and returns statistics of the
        # batch shape, so the common call (one normalized dim, contiguous hidden states) needs no view or reshape:
        # on a GPU host those cost about as much as the launch itself.
        if len(normalized_shape) == 1 and x.is_contiguous():
            out = triton_kernels(__package__).layer_norm_forward(x, w, b, eps, out_dtype, packed, keep_stats)
        else:
            y, mean, rstd = triton_kernels(__package__).layer_norm_forward(
                x.contiguous().reshape(*x.shape[: x.dim() - len(normalized_shape)], cols), w, b, eps, out_dtype)
            out = y.view(x.shape), mean, rstd
        IMPL_CALLS["triton.fwd"] += 1
        return out
    y2d, mean, rstd = cpu.layer_norm_forward(x.contiguous().reshape(rows, cols), w, b, eps, out_dtype)  # (R, C)
    IMPL_CALLS["cpu.fwd"] += 1
    # Statistics shaped like x's batch dims, as aten::native_layer_norm's. reshape_as and unpacked ints: torch parses a
    # torch.Size argument about 1 us slower per call on the CPU.
    batch = x.shape[: x.dim() - len(normalized_shape)]
    if not batch:  # a single row: 0-d statistics (reshape needs at least one size)
        return y2d.reshape_as(x), mean.reshape(()), rstd.reshape(())
    return y2d.reshape_as(x), mean.reshape(*batch), rstd.reshape(*batch)


def _fastlayernorm_fake(x, normalized_shape, weight, bias, eps, out_dtype):
    out_dtype = x.dtype if out_dtype is None else out_dtype
    _check_float("out_dtype", out_dtype)
    _rows_cols(x, normalized_shape, weight, bias)
    stats_dtype = _stats_dtype(_choose_impl(x), x, weight, bias)
    batch_shape = x.shape[: x.dim() - len(normalized_shape)]
    return (x.new_empty(x.shape, dtype=out_dtype), x.new_empty(batch_shape, dtype=stats_dtype),
            x.new_empty(batch_shape, dtype=stats_dtype))


def _fastlayernorm_backward_impl(grad_out: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                                 normalized_shape: Sequence[int], weight: Optional[torch.Tensor],
                                 dx_dtype: torch.dtype, weight_dtype: torch.dtype,
                                 bias_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_backward_args(grad_out, x, mean, rstd, normalized_shape, weight, (dx_dtype, weight_dtype, bias_dtype))
    return _backward(grad_out, x, mean, rstd, normalized_shape, weight, dx_dtype, weight_dtype, bias_dtype)


def _backward(grad_out: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
              normalized_shape: Sequence[int], weight: Optional[torch.Tensor], dx_dtype: torch.dtype,
              weight_dtype: torch.dtype, bias_dtype: torch.dtype,
              shared: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward on checked arguments: the op's, or the direct call's on what its own forward saved (shared:
    dweight and dbias may be views of one result, see the Triton launcher)."""
    impl = _choose_impl(x)
    cols = math.prod(normalized_shape)
    w = _flat_param(weight, cols)
    if impl == "triton" and len(normalized_shape) == 1 and grad_out.is_contiguous() and x.is_contiguous() \
            and mean.is_contiguous() and rstd.is_contiguous():  # as in the forward: no view or reshape
        out = triton_kernels(__package__).layer_norm_backward(grad_out, x, mean, rstd, w, dx_dtype, weight_dtype,
                                                              bias_dtype, shared)
        IMPL_CALLS["triton.bwd"] += 1
        return out
    rows = mean.numel()
    dy2d = grad_out.contiguous().reshape(rows, cols)  # (R, C)
    x2d = x.contiguous().reshape(rows, cols)  # (R, C)
    mean1d, rstd1d = mean.contiguous().reshape(rows), rstd.contiguous().reshape(rows)  # (R,)
    backward = triton_kernels(__package__).layer_norm_backward if impl == "triton" else cpu.layer_norm_backward
    dx2d, dw, db = backward(dy2d, x2d, mean1d, rstd1d, w, dx_dtype, weight_dtype, bias_dtype)
    IMPL_CALLS[_BWD_KEY[impl]] += 1
    # normalized_shape is non-empty (checked above); unpacked, see _fastlayernorm_impl.
    return dx2d.reshape_as(x), dw.reshape(*normalized_shape), db.reshape(*normalized_shape)


def _fastlayernorm_backward_fake(grad_out, x, mean, rstd, normalized_shape, weight, dx_dtype, weight_dtype,
                                 bias_dtype):
    _check_backward_args(grad_out, x, mean, rstd, normalized_shape, weight, (dx_dtype, weight_dtype, bias_dtype))
    return (x.new_empty(x.shape, dtype=dx_dtype), x.new_empty(normalized_shape, dtype=weight_dtype),
            x.new_empty(normalized_shape, dtype=bias_dtype))


def _check_backward_args(grad_out, x, mean, rstd, normalized_shape, weight, dtypes) -> tuple[int, int]:
    if grad_out.shape != x.shape:
        raise ValueError(f"grad_out {tuple(grad_out.shape)} and x {tuple(x.shape)} must have the same shape")
    if grad_out.device != x.device:
        raise ValueError(f"grad_out on {grad_out.device} but x on {x.device}")
    _check_float("grad_out", grad_out.dtype)
    for dtype in dtypes:
        _check_float("gradient dtype", dtype)
    rows, cols = _rows_cols(x, normalized_shape, weight, None)
    for name, stats in (("mean", mean), ("rstd", rstd)):
        if stats.numel() != rows:
            raise ValueError(f"{name} has {stats.numel()} elements, x has {rows} rows")
    return rows, cols


# The Autograd kernels redispatch below autograd (not a second torch.ops call), so a profile shows one
# e2eprof::fastlayernorm event per call, as with custom_op. Like custom_op's autograd kernel, they run the
# implementation with autograd's dispatch keys excluded, so the ~20 aten calls of the CPU implementation skip their
# autograd kernels (nothing there is recorded anyway: grad mode is off, or no input requires grad).
_BELOW_AUTOGRAD = torch._C._after_autograd_keyset
_AutoDispatchBelowAutograd = torch._C._AutoDispatchBelowAutograd
_FWD_OP = torch.ops.e2eprof.fastlayernorm.default
_BWD_OP = torch.ops.e2eprof.fastlayernorm_backward.default


def _save_for_backward(ctx, x: torch.Tensor, normalized_shape: Sequence[int], weight: Optional[torch.Tensor],
                       bias: Optional[torch.Tensor], mean: torch.Tensor, rstd: Optional[torch.Tensor]) -> None:
    # rstd None: mean holds the packed statistics (the Triton launcher's), one saved tensor and no views, which
    # autograd saves and unpacks at a higher host cost than plain tensors.
    ctx.save_for_backward(x, weight, mean, rstd)
    # One attribute, not five: each ctx attribute is a Python setattr per call. Gradients have their tensor's dtype;
    # an absent parameter's (discarded) gradient takes x's.
    ctx.meta = (normalized_shape, weight is not None, bias is not None,
                weight.dtype if weight is not None else x.dtype, bias.dtype if bias is not None else x.dtype)


def _gradients(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """(dx, dweight, dbias) of either Function's backward. As with custom_op's register_autograd before: all three
    are computed whenever backward runs; autograd drops those of inputs that do not require grad, and an absent
    weight or bias gets None."""
    x, weight, mean, rstd = ctx.saved_tensors
    normalized_shape, has_weight, has_bias, weight_dtype, bias_dtype = ctx.meta
    direct = not torch.is_grad_enabled() and run_directly(grad_out)
    if direct and x.is_cuda and len(normalized_shape) == 1 and x.is_contiguous() and grad_out.is_contiguous() \
            and (weight is None or weight.is_contiguous()):
        # The saved tensors are what this op's forward made and checked (on the Triton path: kernel dtypes, a [cols]
        # weight, contiguous fp32 statistics, packed or not), and autograd gives grad_out y's shape, dtype and
        # device: the op's argument checks, and the Triton launcher's, would only repeat that.
        dx, dweight, dbias = triton_kernels(__package__).layer_norm_backward_unchecked(
            grad_out, x, mean, rstd, weight, x.dtype, weight_dtype, bias_dtype, shared=True)
        IMPL_CALLS["triton.bwd"] += 1
        return dx, dweight if has_weight else None, dbias if has_bias else None
    if rstd is None:  # packed statistics, as two contiguous [*batch] tensors for the checked paths
        mean, rstd = mean.unbind(0)
    if direct:
        _check_float("grad_out", grad_out.dtype)
        dx, dweight, dbias = _backward(grad_out, x, mean, rstd, normalized_shape, weight, x.dtype, weight_dtype,
                                       bias_dtype, shared=True)
    else:
        dx, dweight, dbias = _BWD_OP(grad_out, x, mean, rstd, normalized_shape, weight, x.dtype, weight_dtype,
                                     bias_dtype)
    return dx, dweight if has_weight else None, dbias if has_bias else None


class _FastLayerNormFunction(torch.autograd.Function):
    """The Autograd kernel of e2eprof::fastlayernorm: runs the op below autograd and records its backward."""

    @staticmethod
    def forward(ctx, keyset, x: torch.Tensor, normalized_shape: Sequence[int], weight: Optional[torch.Tensor],
                bias: Optional[torch.Tensor], eps: float,
                out_dtype: Optional[torch.dtype]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with _AutoDispatchBelowAutograd():
            y, mean, rstd = _FWD_OP.redispatch(keyset, x, normalized_shape, weight, bias, eps, out_dtype)
        ctx.mark_non_differentiable(mean, rstd)
        # mean and rstd never get a gradient: without this autograd would fill two zero tensors for them on every
        # backward (two allocations and two fill launches on a GPU).
        ctx.set_materialize_grads(False)
        _save_for_backward(ctx, x, normalized_shape, weight, bias, mean, rstd)
        return y, mean, rstd

    @staticmethod
    def backward(ctx, grad_out: Optional[torch.Tensor], _grad_mean, _grad_rstd):
        if grad_out is None:  # y did not reach the loss (possible now that grads are not materialised)
            return None, None, None, None, None, None, None
        dx, dweight, dbias = _gradients(ctx, grad_out)
        return None, dx, None, dweight, dbias, None, None


class _FastLayerNormDirect(torch.autograd.Function):
    """An eager call that skips the dispatcher (run_directly), as fastsoftmax's: y is its only output. The statistics
    stay in ctx, so autograd tracks one output instead of three (its host cost per output is paid on every call)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, normalized_shape: Sequence[int], weight: Optional[torch.Tensor],
                bias: Optional[torch.Tensor], eps: float, out_dtype: Optional[torch.dtype]) -> torch.Tensor:
        with _AutoDispatchBelowAutograd():
            y, mean, rstd = _fastlayernorm_impl(x, normalized_shape, weight, bias, eps, out_dtype, packed=True)
        _save_for_backward(ctx, x, normalized_shape, weight, bias, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        dx, dweight, dbias = _gradients(ctx, grad_out)
        return dx, None, dweight, dbias, None, None


def _fastlayernorm_autograd(keyset, x: torch.Tensor, normalized_shape: Sequence[int], weight: Optional[torch.Tensor],
                            bias: Optional[torch.Tensor], eps: float,
                            out_dtype: Optional[torch.dtype]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    below = keyset & _BELOW_AUTOGRAD
    # Recorded when any of x, weight, bias requires grad (as custom_op did), whichever of them are given.
    if torch.is_grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad)
                                    or (bias is not None and bias.requires_grad)):
        return _FastLayerNormFunction.apply(below, x, normalized_shape, weight, bias, eps, out_dtype)
    with _AutoDispatchBelowAutograd():
        return _FWD_OP.redispatch(below, x, normalized_shape, weight, bias, eps, out_dtype)


def _fastlayernorm_backward_autograd(keyset, grad_out: torch.Tensor, x: torch.Tensor, mean: torch.Tensor,
                                     rstd: torch.Tensor, normalized_shape: Sequence[int],
                                     weight: Optional[torch.Tensor], dx_dtype: torch.dtype, weight_dtype: torch.dtype,
                                     bias_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # No double backward: refuse rather than let autograd treat the gradient as a constant without a word.
    if torch.is_grad_enabled() and (grad_out.requires_grad or x.requires_grad or mean.requires_grad
                                    or rstd.requires_grad or (weight is not None and weight.requires_grad)):
        raise RuntimeError(
            "e2eprof::fastlayernorm_backward is not differentiable (no double backward through fastlayernorm)")
    with _AutoDispatchBelowAutograd():
        return _BWD_OP.redispatch(keyset & _BELOW_AUTOGRAD, grad_out, x, mean, rstd, normalized_shape, weight,
                                  dx_dtype, weight_dtype, bias_dtype)


register_kernels(_LIB, "fastlayernorm", impl=_fastlayernorm_impl,
                 autograd=_fastlayernorm_autograd, fake=_fastlayernorm_fake)
register_kernels(_LIB, "fastlayernorm_backward", impl=_fastlayernorm_backward_impl,
                 autograd=_fastlayernorm_backward_autograd, fake=_fastlayernorm_backward_fake)


def _as_shape(normalized_shape: int | Sequence[int]) -> list[int]:
    return [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)


def fastlayernorm(x: torch.Tensor, normalized_shape: int | Sequence[int], weight: Optional[torch.Tensor] = None,
                  bias: Optional[torch.Tensor] = None, eps: float = 1e-5,
                  out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """LayerNorm of `x` over its last dims `normalized_shape`, written as `out_dtype` (default: x.dtype).

    Calls `torch.ops.e2eprof.fastlayernorm`: reads x, weight and bias in their own dtypes and computes in fp32
    (fp64 when an operand is fp64, CPU implementation only). Differentiable in x, weight and bias; each gradient
    has its tensor's dtype. The result is a new contiguous tensor.
    """
    if run_directly(x, weight, bias):
        if torch.is_grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad)
                                        or (bias is not None and bias.requires_grad)):
            return _FastLayerNormDirect.apply(x, _as_shape(normalized_shape), weight, bias, eps, out_dtype)
        # Nothing requires grad, so autograd records nothing: no guard needed (as in the other five ops).
        return _fastlayernorm_impl(x, _as_shape(normalized_shape), weight, bias, eps, out_dtype, keep_stats=False)[0]
    y, _mean, _rstd = torch.ops.e2eprof.fastlayernorm(x, _as_shape(normalized_shape), weight, bias, eps, out_dtype)
    return y


def reference_layer_norm(x: torch.Tensor, normalized_shape: int | Sequence[int],
                         weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                         eps: float = 1e-5) -> torch.Tensor:
    """Trusted fp64 reference: torch's layer_norm on float64 copies of every operand, returned as float64.

    Uses the stock op on purpose: it is the yardstick the kernels are measured against, not a kernel.
    Differentiable, so it also gives fp64 reference gradients (for weight and bias too, when they require grad).
    """
    return torch.nn.functional.layer_norm(x.double(), _as_shape(normalized_shape), _double(weight), _double(bias), eps)


def _double(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.double()
