"""Named custom ops `e2eprof::fusedsoftmax` and `e2eprof::fusedsoftmax_backward`, with dispatch and autograd.

fusedsoftmax(scores, mask, scale, out_dtype) = softmax(scale * scores + mask, dim=-1) written as out_dtype, for
(B, H, T, S) attention scores and an optional additive mask broadcastable to them (GPT-2's (B, 1, T, S) causal +
padding mask). Named ops (not a bare autograd.Function) so profiler traces, opcheck and torch.compile see one
opaque op per call; registered through torch.library.Library, with an autograd.Function as the op's Autograd kernel,
because torch.library.custom_op's per-call Python layers cost more host time than a small softmax (see _LIB below).
Dispatch (kernels/_dispatch.py): CUDA tensors run the Triton kernels; CPU tensors run cpu.py unless
E2EPROF_FUSEDSOFTMAX_IMPL=triton forces the Triton kernels (under TRITON_INTERPRET=1, for tests). No fallback to
torch's softmax: a missing implementation raises. IMPL_CALLS counts which implementation ran.
"""

import collections
import functools
from typing import Optional

import torch

from .._dispatch import (TRITON_AVAILABLE, check_float, choose_impl, register_kernels, run_directly,
                         triton_kernels)
from . import cpu

IMPL_ENV = "E2EPROF_FUSEDSOFTMAX_IMPL"

# Keys "triton.fwd", "triton.bwd", "cpu.fwd", "cpu.bwd": one per call that reached an implementation
# (empty inputs included: the implementation is chosen and called, it just launches nothing).
IMPL_CALLS: collections.Counter = collections.Counter()


def _choose_impl(t: torch.Tensor) -> str:
    """Pick "triton" or "cpu" for tensor `t`, or raise: never a silent fallback to the stock op."""
    return choose_impl(t, op="fusedsoftmax", env_var=IMPL_ENV, stock="the stock attention softmax",
                       triton_available=TRITON_AVAILABLE)


_check_float = functools.partial(check_float, "fusedsoftmax")  # a TypeError naming e2eprof::fusedsoftmax


def _broadcasts_eager(mask_shape: torch.Size, scores_shape: torch.Size) -> bool:
    """Whether torch.broadcast_shapes(scores_shape, mask_shape) == scores_shape, in plain Python for int shapes.

    The same answer without torch.broadcast_shapes' cost (over 10 us a call on the CPU, more than the op's work on
    small scores): the mask has no more dims than the scores and each of its trailing dims is 1 or the scores' size.
    """
    return len(mask_shape) <= len(scores_shape) and all(
        m == 1 or m == s for m, s in zip(reversed(mask_shape), reversed(scores_shape)))


def _broadcasts_traced(mask_shape: torch.Size, scores_shape: torch.Size) -> bool:
    """The same test through torch.broadcast_shapes, which handles symbolic sizes (fake kernel under compile)."""
    try:
        return torch.broadcast_shapes(scores_shape, mask_shape) == scores_shape
    except RuntimeError:
        return False


def _check_forward_args(scores: torch.Tensor, mask: Optional[torch.Tensor], out_dtype: torch.dtype,
                        broadcasts=_broadcasts_eager) -> None:
    if scores.dim() != 4:
        raise ValueError(f"e2eprof::fusedsoftmax: scores must be (B, H, T, S), got shape {tuple(scores.shape)}")
    _check_float("scores", scores.dtype)
    _check_float("out_dtype", out_dtype)
    if mask is None:
        return
    _check_float("mask", mask.dtype)  # a bool mask added to scores would add 0/1, not mask anything
    if mask.device != scores.device:
        raise ValueError(f"e2eprof::fusedsoftmax: mask on {mask.device} but scores on {scores.device}")
    if not broadcasts(mask.shape, scores.shape):
        # The stock `scores + mask` would broadcast to a bigger tensor; attention masks never do.
        raise ValueError(f"e2eprof::fusedsoftmax: mask {tuple(mask.shape)} does not broadcast to the scores' "
                         f"shape {tuple(scores.shape)}")


# Registered with torch.library.Library rather than torch.library.custom_op, as fastsoftmax is (see its op.py):
# custom_op's per-call Python layers (a generic autograd kernel, alias checks, dynamo-disabling wrappers) cost more
# host time than the op's own work on small scores. Ops, schemas, fake kernels and autograd are the same, so traces,
# opcheck and torch.compile see the same two named ops. With the plain-Python mask check above, this cut about a
# quarter of the host time per forward call (benchmarks/host_overhead.py measures it). One difference: a double
# backward now raises when the first backward is taken with create_graph=True, not later when the second one runs.
_LIB = torch.library.Library("e2eprof", "FRAGMENT")  # kept alive for the registrations' lifetime
_LIB.define("fusedsoftmax(Tensor scores, Tensor? mask, float scale, ScalarType out_dtype) -> Tensor")
_LIB.define("fusedsoftmax_backward(Tensor grad_out, Tensor out, float scale, ScalarType in_dtype) -> Tensor")
_FWD_KEY = {"triton": "triton.fwd", "cpu": "cpu.fwd"}  # built once, not an f-string per call
_BWD_KEY = {"triton": "triton.bwd", "cpu": "cpu.bwd"}


def _fusedsoftmax_impl(scores: torch.Tensor, mask: Optional[torch.Tensor], scale: float,
                       out_dtype: torch.dtype) -> torch.Tensor:
    _check_forward_args(scores, mask, out_dtype)
    impl = _choose_impl(scores)
    x = scores.contiguous()  # (B, H, T, S); a no-op for matmul outputs
    m = mask.expand(x.shape) if mask is not None else None  # a view: broadcast dims get stride 0, nothing copied
    if impl == "triton":
        y = triton_kernels(__package__).fused_softmax_forward(x, m, scale, out_dtype)
    else:
        y = cpu.fused_softmax_forward(x, m, scale, out_dtype)
    IMPL_CALLS[_FWD_KEY[impl]] += 1
    return y


def _fusedsoftmax_fake(scores, mask, scale, out_dtype):
    _check_forward_args(scores, mask, out_dtype, _broadcasts_traced)
    return scores.new_empty(scores.shape, dtype=out_dtype)


def _check_backward_args(grad_out: torch.Tensor, out: torch.Tensor, in_dtype: torch.dtype) -> None:
    if grad_out.shape != out.shape or out.dim() != 4:
        raise ValueError(f"grad_out {tuple(grad_out.shape)} and out {tuple(out.shape)} must be (B, H, T, S) alike")
    if grad_out.device != out.device:
        raise ValueError(f"grad_out on {grad_out.device} but out on {out.device}")
    _check_float("grad_out", grad_out.dtype)
    _check_float("out", out.dtype)
    _check_float("in_dtype", in_dtype)


def _fusedsoftmax_backward_impl(grad_out: torch.Tensor, out: torch.Tensor, scale: float,
                                in_dtype: torch.dtype) -> torch.Tensor:
    _check_backward_args(grad_out, out, in_dtype)
    impl = _choose_impl(out)
    dy, y = grad_out.contiguous(), out.contiguous()  # (B, H, T, S) each
    if impl == "triton":
        dx = triton_kernels(__package__).fused_softmax_backward(dy, y, scale, in_dtype)
    else:
        dx = cpu.fused_softmax_backward(dy, y, scale, in_dtype)
    IMPL_CALLS[_BWD_KEY[impl]] += 1
    return dx


def _fusedsoftmax_backward_fake(grad_out, out, scale, in_dtype):
    _check_backward_args(grad_out, out, in_dtype)
    return out.new_empty(out.shape, dtype=in_dtype)


# The Autograd kernels redispatch below autograd (not a second torch.ops call), so a profile shows one
# e2eprof::fusedsoftmax event per call, as with custom_op.
_BELOW_AUTOGRAD = torch._C._after_autograd_keyset


class _FusedSoftmaxFunction(torch.autograd.Function):
    """The Autograd kernel of e2eprof::fusedsoftmax: runs the op below autograd and records its backward. With keyset None,
    an eager call that skips the dispatcher (run_directly), as fastsoftmax's."""

    @staticmethod
    def forward(ctx, keyset, scores: torch.Tensor, mask: Optional[torch.Tensor], scale: float,
                out_dtype: torch.dtype) -> torch.Tensor:
        y = (_fusedsoftmax_impl(scores, mask, scale, out_dtype) if keyset is None
             else torch.ops.e2eprof.fusedsoftmax.default.redispatch(keyset, scores, mask, scale, out_dtype))
        # Backward needs only y: d softmax(z)/dz = y * (dy - sum(dy * y)), and dz/dscores = scale. Scores and mask
        # are not kept alive. y is the output in its own dtype (bf16 under autocast), the tensor the next matmul
        # saves anyway, so the op adds no activation memory.
        ctx.save_for_backward(y)
        ctx.scale = scale
        ctx.in_dtype = scores.dtype
        ctx.mask_meta = None if mask is None else (mask.shape, mask.dtype)
        return y

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (y,) = ctx.saved_tensors
        backward = (_fusedsoftmax_backward_impl if not torch.is_grad_enabled() and run_directly(grad_out)
                    else torch.ops.e2eprof.fusedsoftmax_backward.default)
        grad_scores = grad_mask = None
        if ctx.needs_input_grad[1]:  # [0] is the keyset
            grad_scores = backward(grad_out, y, ctx.scale, ctx.in_dtype)
        if ctx.mask_meta is not None and ctx.needs_input_grad[2]:
            # Rare (attention masks are constants): dz itself (scale 1), summed over the dims the mask broadcast over.
            shape, dtype = ctx.mask_meta
            dz = backward(grad_out, y, 1.0, torch.float32)
            grad_mask = dz.sum_to_size(shape).to(dtype)
        return None, grad_scores, grad_mask, None, None


def _fusedsoftmax_autograd(keyset, scores: torch.Tensor, mask: Optional[torch.Tensor], scale: float,
                           out_dtype: torch.dtype) -> torch.Tensor:
    below = keyset & _BELOW_AUTOGRAD
    # Either differentiable input counts: a mask that requires grad (rare) gets its gradient, as with custom_op.
    if torch.is_grad_enabled() and (scores.requires_grad or (mask is not None and mask.requires_grad)):
        return _FusedSoftmaxFunction.apply(below, scores, mask, scale, out_dtype)
    return torch.ops.e2eprof.fusedsoftmax.default.redispatch(below, scores, mask, scale, out_dtype)


def _fusedsoftmax_backward_autograd(keyset, grad_out: torch.Tensor, out: torch.Tensor, scale: float,
                                    in_dtype: torch.dtype) -> torch.Tensor:
    # No double backward: refuse rather than let autograd treat the gradient as a constant without a word.
    if torch.is_grad_enabled() and (grad_out.requires_grad or out.requires_grad):
        raise RuntimeError(
            "e2eprof::fusedsoftmax_backward is not differentiable (no double backward through fusedsoftmax)")
    return torch.ops.e2eprof.fusedsoftmax_backward.default.redispatch(keyset & _BELOW_AUTOGRAD, grad_out, out, scale,
                                                                      in_dtype)


register_kernels(_LIB, "fusedsoftmax", impl=_fusedsoftmax_impl,
                 autograd=_fusedsoftmax_autograd, fake=_fusedsoftmax_fake)
register_kernels(_LIB, "fusedsoftmax_backward", impl=_fusedsoftmax_backward_impl,
                 autograd=_fusedsoftmax_backward_autograd, fake=_fusedsoftmax_backward_fake)


def fusedsoftmax(scores: torch.Tensor, mask: Optional[torch.Tensor] = None, scale: float = 1.0,
                 out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """softmax(scale * scores + mask, dim=-1) of (B, H, T, S) scores in one pass, written as `out_dtype`.

    Reads scores and mask in their own dtypes and computes in fp32 (fp64 on the CPU implementation when an input
    is fp64). out_dtype defaults to the scores' dtype. Differentiable in scores (and in mask, should it require
    grad); the scores' gradient has their dtype. The result is a new contiguous tensor.
    """
    out_dtype = scores.dtype if out_dtype is None else out_dtype
    if run_directly(scores, mask):
        if torch.is_grad_enabled() and (scores.requires_grad or (mask is not None and mask.requires_grad)):
            return _FusedSoftmaxFunction.apply(None, scores, mask, float(scale), out_dtype)
        return _fusedsoftmax_impl(scores, mask, float(scale), out_dtype)
    return torch.ops.e2eprof.fusedsoftmax(scores, mask, float(scale), out_dtype)


def reference_fusedsoftmax(scores: torch.Tensor, mask: Optional[torch.Tensor] = None,
                           scale: float = 1.0) -> torch.Tensor:
    """Trusted fp64 reference: torch.softmax(scale * scores + mask) in float64, returned as float64.

    Uses torch's own softmax on float64 on purpose: it is the yardstick, not a kernel. Differentiable, so it also
    gives fp64 reference gradients.
    """
    z = scores.double() * scale
    if mask is not None:
        z = z + mask.double()
    return torch.softmax(z, dim=-1)
