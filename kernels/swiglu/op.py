"""Named custom ops `e2eprof::swiglu` and `e2eprof::swiglu_backward`, with dispatch and autograd.

Named ops (not a bare autograd.Function) so profiler traces, opcheck and torch.compile see one opaque op per call.
Dispatch: CUDA tensors run the Triton kernels; CPU tensors run cpu.py unless E2EPROF_SWIGLU_IMPL=triton forces the
Triton kernels (meaningful only under TRITON_INTERPRET=1; used by tests). There is deliberately no fallback to
F.silu(gate) * up: a patch that silently runs the stock ops is exactly what e2eprof must catch, so a missing
implementation raises instead. IMPL_CALLS counts which implementation ran, for the report.
"""

import collections

import torch

from .._dispatch import TRITON_AVAILABLE, choose_impl, triton_kernels
from . import cpu

IMPL_ENV = "E2EPROF_SWIGLU_IMPL"

# Keys "triton.fwd", "triton.bwd", "cpu.fwd", "cpu.bwd": one per call that reached an implementation.
IMPL_CALLS: collections.Counter = collections.Counter()


def _choose_impl(t: torch.Tensor) -> str:
    """Pick "triton" or "cpu" for tensor `t`, or raise: never a silent fallback to the stock ops."""
    return choose_impl(t, op="swiglu", env_var=IMPL_ENV, stock="F.silu(gate) * up", triton_available=TRITON_AVAILABLE)


def _check_args(*named: tuple[str, torch.Tensor]) -> None:
    first = named[0][1]
    for name, t in named:
        if not t.dtype.is_floating_point:
            raise TypeError(f"e2eprof::swiglu: {name} must be floating, got {t.dtype}")
        # No broadcasting: in an MLP both projections have the same shape, and a mismatch is a bug to surface.
        if t.shape != first.shape or t.device != first.device:
            raise ValueError(f"e2eprof::swiglu: {name} is {tuple(t.shape)} on {t.device}, expected "
                             f"{tuple(first.shape)} on {first.device} like {named[0][0]}")


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1)


@torch.library.custom_op("e2eprof::swiglu", mutates_args=(), schema="(Tensor gate, Tensor up) -> Tensor")
def _swiglu_op(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    _check_args(("gate", gate), ("up", up))
    impl = _choose_impl(gate)
    kernels = triton_kernels(__package__) if impl == "triton" else cpu
    y = kernels.swiglu_forward(_flat(gate), _flat(up))
    IMPL_CALLS[f"{impl}.fwd"] += 1
    return y.reshape(gate.shape)


@_swiglu_op.register_fake
def _swiglu_fake(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    _check_args(("gate", gate), ("up", up))
    return gate.new_empty(gate.shape, dtype=torch.promote_types(gate.dtype, up.dtype))


@torch.library.custom_op(
    "e2eprof::swiglu_backward", mutates_args=(), schema="(Tensor grad_out, Tensor gate, Tensor up) -> (Tensor, Tensor)"
)
def _swiglu_backward_op(grad_out: torch.Tensor, gate: torch.Tensor,
                        up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _check_args(("gate", gate), ("up", up), ("grad_out", grad_out))
    impl = _choose_impl(gate)
    kernels = triton_kernels(__package__) if impl == "triton" else cpu
    dgate, dup = kernels.swiglu_backward(_flat(grad_out), _flat(gate), _flat(up))
    IMPL_CALLS[f"{impl}.bwd"] += 1
    return dgate.reshape(gate.shape), dup.reshape(up.shape)


@_swiglu_backward_op.register_fake
def _swiglu_backward_fake(grad_out: torch.Tensor, gate: torch.Tensor,
                          up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _check_args(("gate", gate), ("up", up), ("grad_out", grad_out))
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


def _setup_context(ctx, inputs, output) -> None:
    gate, up = inputs
    # Backward recomputes sigmoid(gate) from gate: no activation-sized temporary is kept alive.
    ctx.save_for_backward(gate, up)


def _backward(ctx, grad_out):
    gate, up = ctx.saved_tensors
    return torch.ops.e2eprof.swiglu_backward(grad_out, gate, up)


_swiglu_op.register_autograd(_backward, setup_context=_setup_context)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up via `torch.ops.e2eprof.swiglu`: fp32 math, one rounding to promote_types(gate, up).

    gate and up must have the same shape (no broadcasting). Differentiable in both; the result is a new contiguous
    tensor of gate's shape.
    """
    return torch.ops.e2eprof.swiglu(gate, up)


def reference_swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Trusted fp64 reference: F.silu(gate.double()) * up.double(), differentiable in both."""
    return torch.nn.functional.silu(gate.double()) * up.double()
