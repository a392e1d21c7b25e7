"""Named custom ops `e2eprof::fusedsoftmax` and `e2eprof::fusedsoftmax_backward`, with dispatch and autograd.

fusedsoftmax(scores, mask, scale, out_dtype) = softmax(scale * scores + mask, dim=-1) written as out_dtype, for
(B, H, T, S) attention scores and an optional additive mask broadcastable to them (GPT-2's (B, 1, T, S) causal +
padding mask). Named ops (not a bare autograd.Function) so profiler traces, opcheck and torch.compile see one
opaque op per call. Dispatch (kernels/_dispatch.py): CUDA tensors run the Triton kernels; CPU tensors run cpu.py
unless E2EPROF_FUSEDSOFTMAX_IMPL=triton forces the Triton kernels (under TRITON_INTERPRET=1, for tests). No
fallback to torch's softmax: a missing implementation raises. IMPL_CALLS counts which implementation ran.
"""

import collections
import functools
from typing import Optional

import torch

from .._dispatch import TRITON_AVAILABLE, check_float, choose_impl, triton_kernels
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


def _check_forward_args(scores: torch.Tensor, mask: Optional[torch.Tensor], out_dtype: torch.dtype) -> None:
    if scores.dim() != 4:
        raise ValueError(f"e2eprof::fusedsoftmax: scores must be (B, H, T, S), got shape {tuple(scores.shape)}")
    _check_float("scores", scores.dtype)
    _check_float("out_dtype", out_dtype)
    if mask is None:
        return
    _check_float("mask", mask.dtype)  # a bool mask added to scores would add 0/1, not mask anything
    if mask.device != scores.device:
        raise ValueError(f"e2eprof::fusedsoftmax: mask on {mask.device} but scores on {scores.device}")
    try:
        broadcast = torch.broadcast_shapes(scores.shape, mask.shape)
    except RuntimeError:
        broadcast = None
    if broadcast != scores.shape:
        # The stock `scores + mask` would broadcast to a bigger tensor; attention masks never do.
        raise ValueError(f"e2eprof::fusedsoftmax: mask {tuple(mask.shape)} does not broadcast to the scores' "
                         f"shape {tuple(scores.shape)}")


@torch.library.custom_op(
    "e2eprof::fusedsoftmax",
    mutates_args=(),
    schema="(Tensor scores, Tensor? mask, float scale, ScalarType out_dtype) -> Tensor",
)
def _fusedsoftmax_op(scores: torch.Tensor, mask: Optional[torch.Tensor], scale: float,
                     out_dtype: torch.dtype) -> torch.Tensor:
    _check_forward_args(scores, mask, out_dtype)
    impl = _choose_impl(scores)
    x = scores.contiguous()  # (B, H, T, S); a no-op for matmul outputs
    m = mask.expand(x.shape) if mask is not None else None  # a view: broadcast dims get stride 0, nothing copied
    if impl == "triton":
        y = triton_kernels(__package__).fused_softmax_forward(x, m, scale, out_dtype)
    else:
        y = cpu.fused_softmax_forward(x, m, scale, out_dtype)
    IMPL_CALLS[f"{impl}.fwd"] += 1
    return y


@_fusedsoftmax_op.register_fake
def _fusedsoftmax_fake(scores, mask, scale, out_dtype):
    _check_forward_args(scores, mask, out_dtype)
    return scores.new_empty(scores.shape, dtype=out_dtype)


def _check_backward_args(grad_out: torch.Tensor, out: torch.Tensor, in_dtype: torch.dtype) -> None:
    if grad_out.shape != out.shape or out.dim() != 4:
        raise ValueError(f"grad_out {tuple(grad_out.shape)} and out {tuple(out.shape)} must be (B, H, T, S) alike")
    if grad_out.device != out.device:
        raise ValueError(f"grad_out on {grad_out.device} but out on {out.device}")
    _check_float("grad_out", grad_out.dtype)
    _check_float("out", out.dtype)
    _check_float("in_dtype", in_dtype)


@torch.library.custom_op(
    "e2eprof::fusedsoftmax_backward",
    mutates_args=(),
    schema="(Tensor grad_out, Tensor out, float scale, ScalarType in_dtype) -> Tensor",
)
def _fusedsoftmax_backward_op(grad_out: torch.Tensor, out: torch.Tensor, scale: float,
                              in_dtype: torch.dtype) -> torch.Tensor:
    _check_backward_args(grad_out, out, in_dtype)
    impl = _choose_impl(out)
    dy, y = grad_out.contiguous(), out.contiguous()  # (B, H, T, S) each
    if impl == "triton":
        dx = triton_kernels(__package__).fused_softmax_backward(dy, y, scale, in_dtype)
    else:
        dx = cpu.fused_softmax_backward(dy, y, scale, in_dtype)
    IMPL_CALLS[f"{impl}.bwd"] += 1
    return dx


@_fusedsoftmax_backward_op.register_fake
def _fusedsoftmax_backward_fake(grad_out, out, scale, in_dtype):
    _check_backward_args(grad_out, out, in_dtype)
    return out.new_empty(out.shape, dtype=in_dtype)


def _setup_context(ctx, inputs, output) -> None:
    scores, mask, scale, _out_dtype = inputs
    # Backward needs only y: d softmax(z)/dz = y * (dy - sum(dy * y)), and dz/dscores = scale. Scores and mask
    # are not kept alive. y is the output in its own dtype (bf16 under autocast), the tensor the next matmul
    # saves anyway, so the op adds no activation memory.
    ctx.save_for_backward(output)
    ctx.scale = scale
    ctx.in_dtype = scores.dtype
    ctx.mask_meta = None if mask is None else (mask.shape, mask.dtype)


def _backward(ctx, grad_out):
    (y,) = ctx.saved_tensors
    grad_scores = grad_mask = None
    if ctx.needs_input_grad[0]:
        grad_scores = torch.ops.e2eprof.fusedsoftmax_backward(grad_out, y, ctx.scale, ctx.in_dtype)
    if ctx.mask_meta is not None and ctx.needs_input_grad[1]:
        # Rare (attention masks are constants): dz itself (scale 1), summed over the dims the mask broadcast over.
        shape, dtype = ctx.mask_meta
        dz = torch.ops.e2eprof.fusedsoftmax_backward(grad_out, y, 1.0, torch.float32)
        grad_mask = dz.sum_to_size(shape).to(dtype)
    return grad_scores, grad_mask, None, None


_fusedsoftmax_op.register_autograd(_backward, setup_context=_setup_context)


def fusedsoftmax(scores: torch.Tensor, mask: Optional[torch.Tensor] = None, scale: float = 1.0,
                 out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """softmax(scale * scores + mask, dim=-1) of (B, H, T, S) scores in one pass, written as `out_dtype`.

    Reads scores and mask in their own dtypes and computes in fp32 (fp64 on the CPU implementation when an input
    is fp64). out_dtype defaults to the scores' dtype. Differentiable in scores (and in mask, should it require
    grad); the scores' gradient has their dtype. The result is a new contiguous tensor.
    """
    return torch.ops.e2eprof.fusedsoftmax(scores, mask, float(scale), scores.dtype if out_dtype is None else out_dtype)


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
