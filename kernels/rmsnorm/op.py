"""Named custom ops `e2eprof::rmsnorm` and `e2eprof::rmsnorm_backward`, with dispatch and autograd.

Named ops (not a bare autograd.Function) so profiler traces, opcheck and torch.compile see one opaque op per call.
Dispatch: CUDA tensors run the Triton kernels; CPU tensors run cpu.py unless E2EPROF_RMSNORM_IMPL=triton forces the
Triton kernels (meaningful only under TRITON_INTERPRET=1; used by tests). There is deliberately no fallback to the
stock module: a patch that silently runs the stock code is exactly what e2eprof must catch, so a missing
implementation raises instead. IMPL_CALLS counts which implementation ran, for the report.
"""

import collections
import math

import torch

from .._dispatch import TRITON_AVAILABLE, choose_impl, register_kernels, run_directly, triton_kernels
from . import cpu

IMPL_ENV = "E2EPROF_RMSNORM_IMPL"

# Keys "triton.fwd", "triton.bwd", "cpu.fwd", "cpu.bwd": one per call that reached an implementation.
IMPL_CALLS: collections.Counter = collections.Counter()


def _choose_impl(t: torch.Tensor) -> str:
    """Pick "triton" or "cpu" for tensor `t`, or raise: never a silent fallback to the stock module."""
    return choose_impl(t, op="rmsnorm", env_var=IMPL_ENV, stock="LlamaRMSNorm", triton_available=TRITON_AVAILABLE)


def _check_args(x: torch.Tensor, weight: torch.Tensor) -> None:
    if not (x.dtype.is_floating_point and weight.dtype.is_floating_point):
        raise TypeError(f"e2eprof::rmsnorm: x and weight must be floating, got {x.dtype} and {weight.dtype}")
    if x.dim() == 0 or weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"e2eprof::rmsnorm normalises the last dim: weight must be [{x.shape[-1] if x.dim() else '?'}]"
                         f", got x {tuple(x.shape)} and weight {tuple(weight.shape)}")
    if x.device != weight.device:
        raise ValueError(f"x on {x.device} but weight on {weight.device}")


def _rows(t: torch.Tensor) -> torch.Tensor:
    """View `t` (..., C) as a contiguous [rows, C] matrix (copies only if needed)."""
    return t.contiguous().reshape(math.prod(t.shape[:-1]), t.shape[-1])  # not numel // C: C may be 0


# Registered with torch.library.Library rather than torch.library.custom_op, as fastsoftmax is (see its op.py):
# custom_op's per-call Python layers cost more host time than a small RMSNorm; ops, schemas, fake kernels and
# autograd stay the same, so traces, opcheck and torch.compile see the same two named ops.
_LIB = torch.library.Library("e2eprof", "FRAGMENT")  # kept alive for the registrations' lifetime
_LIB.define("rmsnorm(Tensor x, Tensor weight, float eps) -> Tensor")
_LIB.define("rmsnorm_backward(Tensor grad_out, Tensor x, Tensor weight, float eps) -> (Tensor, Tensor)")
_FWD_KEY = {"triton": "triton.fwd", "cpu": "cpu.fwd"}  # built once, not an f-string per call
_BWD_KEY = {"triton": "triton.bwd", "cpu": "cpu.bwd"}


def _rmsnorm_impl(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    _check_args(x, weight)
    impl = _choose_impl(x)
    kernels = triton_kernels(__package__) if impl == "triton" else cpu
    y2d = kernels.rmsnorm_forward(_rows(x), weight.contiguous(), eps)  # (R, C)
    IMPL_CALLS[_FWD_KEY[impl]] += 1
    return y2d.reshape(x.shape)


def _rmsnorm_fake(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    _check_args(x, weight)
    return x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype))


def _rmsnorm_backward_impl(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    _check_backward_args(grad_out, x, weight)
    impl = _choose_impl(x)
    kernels = triton_kernels(__package__) if impl == "triton" else cpu
    dx2d, dw = kernels.rmsnorm_backward(_rows(grad_out), _rows(x), weight.contiguous(), eps)
    IMPL_CALLS[_BWD_KEY[impl]] += 1
    return dx2d.reshape(x.shape), dw


def _rmsnorm_backward_fake(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    _check_backward_args(grad_out, x, weight)
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


def _check_backward_args(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    _check_args(x, weight)
    if grad_out.shape != x.shape or grad_out.device != x.device or not grad_out.dtype.is_floating_point:
        raise ValueError(f"grad_out must be a floating tensor shaped like x {tuple(x.shape)} on {x.device}, got "
                         f"{tuple(grad_out.shape)} {grad_out.dtype} on {grad_out.device}")


# The Autograd kernels redispatch below autograd (not a second torch.ops call), so a profile shows one
# e2eprof::rmsnorm event per call, as with custom_op.
_BELOW_AUTOGRAD = torch._C._after_autograd_keyset


class _RMSNormFunction(torch.autograd.Function):
    """The Autograd kernel of e2eprof::rmsnorm: runs the op below autograd and records its backward. With keyset None,
    an eager call that skips the dispatcher (run_directly), as fastsoftmax's."""

    @staticmethod
    def forward(ctx, keyset, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        # Backward recomputes rstd from x (it reads x anyway), so only the inputs are kept.
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        if keyset is None:
            return _rmsnorm_impl(x, weight, eps)
        return torch.ops.e2eprof.rmsnorm.default.redispatch(keyset, x, weight, eps)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        x, weight = ctx.saved_tensors
        if not torch.is_grad_enabled() and run_directly(grad_out):
            dx, dw = _rmsnorm_backward_impl(grad_out, x, weight, ctx.eps)
        else:
            dx, dw = torch.ops.e2eprof.rmsnorm_backward.default(grad_out, x, weight, ctx.eps)
        return None, dx, dw, None


def _rmsnorm_autograd(keyset, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    below = keyset & _BELOW_AUTOGRAD
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return _RMSNormFunction.apply(below, x, weight, eps)
    return torch.ops.e2eprof.rmsnorm.default.redispatch(below, x, weight, eps)


def _rmsnorm_backward_autograd(keyset, grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                               eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    # No double backward: refuse rather than let autograd treat the gradient as a constant without a word.
    if torch.is_grad_enabled() and (grad_out.requires_grad or x.requires_grad or weight.requires_grad):
        raise RuntimeError("e2eprof::rmsnorm_backward is not differentiable (no double backward through rmsnorm)")
    return torch.ops.e2eprof.rmsnorm_backward.default.redispatch(keyset & _BELOW_AUTOGRAD, grad_out, x, weight, eps)


register_kernels(_LIB, "rmsnorm", impl=_rmsnorm_impl, autograd=_rmsnorm_autograd, fake=_rmsnorm_fake)
register_kernels(_LIB, "rmsnorm_backward", impl=_rmsnorm_backward_impl,
                 autograd=_rmsnorm_backward_autograd, fake=_rmsnorm_backward_fake)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, via `torch.ops.e2eprof.rmsnorm`: weight * (x / sqrt(mean(x^2) + eps)).

    Same numerics as transformers' LlamaRMSNorm: fp32 math, the normalised row rounded to x's dtype, then multiplied
    by the weight; the output dtype is torch.promote_types(x.dtype, weight.dtype). Differentiable in x and weight.
    The result is a new contiguous tensor of x's shape.
    """
    if run_directly(x, weight):
        if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
            return _RMSNormFunction.apply(None, x, weight, float(eps))
        return _rmsnorm_impl(x, weight, float(eps))
    return torch.ops.e2eprof.rmsnorm(x, weight, float(eps))


def reference_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Trusted fp64 reference (no rounding anywhere), returned as float64 and differentiable in x and weight."""
    x64 = x.double()
    return weight.double() * (x64 * torch.rsqrt(x64.pow(2).mean(dim=-1, keepdim=True) + eps))
