"""CPU SwiGLU built from elementwise torch primitives, on 1-D contiguous tensors of the same length.

A real implementation, not F.silu(gate) * up relabelled: the tool must be able to tell that this code (and not the
stock ops) ran. Same contract as the Triton launchers: read gate and up in their own dtypes, compute in fp32 (fp64
when an input is fp64) and round once to the output dtype, torch.promote_types(gate.dtype, up.dtype).
"""

import torch

from .._cpu_math import chunks, compute_dtype


def _sigmoid(g: torch.Tensor) -> torch.Tensor:
    # 1 / (1 + exp(-g)): exp overflows to inf for g < -88 (fp32) and gives exactly 0, as the limit should.
    return torch.neg(g).exp_().add_(1).reciprocal_()


def swiglu_forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up = gate * sigmoid(gate) * up, elementwise, rounded once to promote_types(gate, up)."""
    _check(gate, up)
    compute = compute_dtype(gate, up)
    y = torch.empty_like(gate, dtype=torch.promote_types(gate.dtype, up.dtype))
    for sl in chunks(gate.numel()):
        g = gate[sl].to(compute)  # may alias gate when already `compute`, so never modified in place
        y[sl] = _sigmoid(g).mul_(g).mul_(up[sl].to(compute))  # copy_ casts to the output dtype
    return y


def swiglu_backward(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dgate in gate's dtype, dup in up's dtype) for y = silu(gate) * up, in fp32 (fp64 for fp64 inputs).

    With s = sigmoid(gate):  dgate = dy * up * s * (1 + gate * (1 - s)),  dup = dy * gate * s.
    """
    _check(gate, up)
    if dy.shape != gate.shape or dy.dim() != 1:
        raise ValueError(f"dy {tuple(dy.shape)} must be 1-D like gate {tuple(gate.shape)}")
    compute = compute_dtype(dy, gate, up)
    dgate = torch.empty_like(gate)
    dup = torch.empty_like(up)
    for sl in chunks(gate.numel()):
        g = gate[sl].to(compute)
        u = up[sl].to(compute)
        d = dy[sl].to(compute)
        s = _sigmoid(g)
        silu = torch.mul(g, s)
        dup[sl] = torch.mul(d, silu)
        # s * (1 + g * (1 - s)) = s + silu * (1 - s)
        dgate[sl] = torch.rsub(s, 1).mul_(silu).add_(s).mul_(u).mul_(d)
    return dgate, dup


def _check(gate: torch.Tensor, up: torch.Tensor) -> None:
    if gate.dim() != 1 or gate.shape != up.shape:
        raise ValueError(f"gate and up must be 1-D of the same length, got {tuple(gate.shape)} and {tuple(up.shape)}")
