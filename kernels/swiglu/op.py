"""Named custom ops `e2eprof::swiglu` and `e2eprof::swiglu_backward`, with dispatch and autograd.

Named ops (not a bare autograd.Function) so profiler traces, opcheck and torch.compile see one opaque op per call.
Dispatch: CUDA tensors run the Triton kernels; CPU tensors run cpu.py unless E2EPROF_SWIGLU_IMPL=triton forces the
Triton kernels (meaningful only under TRITON_INTERPRET=1; used by tests). There is deliberately no fallback to
F.silu(gate) * up: a patch that silently runs the stock ops is exactly what e2eprof must catch, so a missing
implementation raises instead. IMPL_CALLS counts which implementation ran, for the report.
"""

import collections

import torch

from .._dispatch import TRITON_AVAILABLE, choose_impl, register_kernels, run_directly, triton_kernels
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


# Registered with torch.library.Library rather than torch.library.custom_op, as fastsoftmax is (see its op.py):
# custom_op's per-call Python layers cost more host time than a small swiglu; ops, schemas, fake kernels and
# autograd stay the same, so traces, opcheck and torch.compile see the same two named ops.
_LIB = torch.library.Library("e2eprof", "FRAGMENT")  # kept alive for the registrations' lifetime
_LIB.define("swiglu(Tensor gate, Tensor up) -> Tensor")
_LIB.define("swiglu_backward(Tensor grad_out, Tensor gate, Tensor up) -> (Tensor, Tensor)")
_FWD_KEY = {"triton": "triton.fwd", "cpu": "cpu.fwd"}  # built once, not an f-string per call
_BWD_KEY = {"triton": "triton.bwd", "cpu": "cpu.bwd"}


def _swiglu_impl(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    _check_args(("gate", gate), ("up", up))
    if gate.is_cuda and TRITON_AVAILABLE and gate.is_contiguous() and up.is_contiguous():
        # Contiguous: the kernel walks the memory flat, no views.
        y = triton_kernels(__package__).swiglu_forward(gate, up)
        IMPL_CALLS["triton.fwd"] += 1
        return y
    impl = _choose_impl(gate)
    kernels = triton_kernels(__package__) if impl == "triton" else cpu
    y = kernels.swiglu_forward(_flat(gate), _flat(up))
    IMPL_CALLS[_FWD_KEY[impl]] += 1
    return y.reshape(gate.shape)


def _swiglu_fake(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    _check_args(("gate", gate), ("up", up))
    return gate.new_empty(gate.shape, dtype=torch.promote_types(gate.dtype, up.dtype))


def _swiglu_backward_impl(grad_out: torch.Tensor, gate: torch.Tensor,
                          up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _check_args(("gate", gate), ("up", up), ("grad_out", grad_out))
    if gate.is_cuda and TRITON_AVAILABLE and gate.is_contiguous() and up.is_contiguous() and grad_out.is_contiguous():
        dgate, dup = triton_kernels(__package__).swiglu_backward(grad_out, gate, up)
        IMPL_CALLS["triton.bwd"] += 1
        return dgate, dup
    impl = _choose_impl(gate)
    kernels = triton_kernels(__package__) if impl == "triton" else cpu
    dgate, dup = kernels.swiglu_backward(_flat(grad_out), _flat(gate), _flat(up))
    IMPL_CALLS[_BWD_KEY[impl]] += 1
    return dgate.reshape(gate.shape), dup.reshape(up.shape)


def _swiglu_backward_fake(grad_out: torch.Tensor, gate: torch.Tensor,
                          up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _check_args(("gate", gate), ("up", up), ("grad_out", grad_out))
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


# The Autograd kernels redispatch below autograd (not a second torch.ops call), so a profile shows one
# e2eprof::swiglu event per call, as with custom_op.
_BELOW_AUTOGRAD = torch._C._after_autograd_keyset


class _SwigluFunction(torch.autograd.Function):
    """The Autograd kernel of e2eprof::swiglu: runs the op below autograd and records its backward. With keyset None,
    an eager call that skips the dispatcher (run_directly), as fastsoftmax's."""

    @staticmethod
    def forward(ctx, keyset, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        # Backward recomputes sigmoid(gate) from gate: no activation-sized temporary is kept alive.
        ctx.save_for_backward(gate, up)
        if keyset is None:
            return _swiglu_impl(gate, up)
        return torch.ops.e2eprof.swiglu.default.redispatch(keyset, gate, up)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        gate, up = ctx.saved_tensors
        if not torch.is_grad_enabled() and run_directly(grad_out):
            dgate, dup = _swiglu_backward_impl(grad_out, gate, up)
        else:
            dgate, dup = torch.ops.e2eprof.swiglu_backward.default(grad_out, gate, up)
        return None, dgate, dup


def _swiglu_autograd(keyset, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    below = keyset & _BELOW_AUTOGRAD
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        return _SwigluFunction.apply(below, gate, up)
    return torch.ops.e2eprof.swiglu.default.redispatch(below, gate, up)


def _swiglu_backward_autograd(keyset, grad_out: torch.Tensor, gate: torch.Tensor,
                              up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # No double backward: refuse rather than let autograd treat the gradient as a constant without a word.
    if torch.is_grad_enabled() and (grad_out.requires_grad or gate.requires_grad or up.requires_grad):
        raise RuntimeError("e2eprof::swiglu_backward is not differentiable (no double backward through swiglu)")
    return torch.ops.e2eprof.swiglu_backward.default.redispatch(keyset & _BELOW_AUTOGRAD, grad_out, gate, up)


register_kernels(_LIB, "swiglu", impl=_swiglu_impl, autograd=_swiglu_autograd, fake=_swiglu_fake)
register_kernels(_LIB, "swiglu_backward", impl=_swiglu_backward_impl,
                 autograd=_swiglu_backward_autograd, fake=_swiglu_backward_fake)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up via `torch.ops.e2eprof.swiglu`: fp32 math, one rounding to promote_types(gate, up).

    gate and up must have the same shape (no broadcasting). Differentiable in both; the result is a new contiguous
    tensor of gate's shape.
    """
    if run_directly(gate, up):
        if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
            return _SwigluFunction.apply(None, gate, up)
        return _swiglu_impl(gate, up)
    return torch.ops.e2eprof.swiglu(gate, up)


def reference_swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Trusted fp64 reference: F.silu(gate.double()) * up.double(), differentiable in both."""
    return torch.nn.functional.silu(gate.double()) * up.double()
