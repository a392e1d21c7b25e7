"""CPU tanh-approximation GELU (GPT-2's `gelu_new`) built from elementwise torch primitives, on flat 1-D tensors.

A real implementation, not torch's gelu relabelled: the tool must be able to tell that this code (and not the stock
op) ran, and its numerics are ours to test. Same contract and same formula as the Triton kernels: read x in its own
dtype, compute in fp32 (fp64 when the input is fp64), write the requested dtype.

The formula. 0.5 * (1 + tanh(u)) is sigmoid(2u), so with u = sqrt(2/pi) * (x + 0.044715 x^3):
    y   = x * s,                    s = sigmoid(2u)
    y'  = s + 2x * s(1-s) * du/dx,  du/dx = sqrt(2/pi) * (1 + 3 * 0.044715 x^2)
and with e = exp(-2|u|) in (0, 1] (never overflows), s = 1/(1+e) for u >= 0, e/(1+e) for u < 0, s(1-s) = e/(1+e)^2.
Unlike 1 + tanh(u), this never cancels for negative x. NaN in gives NaN out; x = +inf gives +inf and x = -inf gives
NaN (-inf * 0), as the stock formula does.
"""

import math

import torch

from .._cpu_math import chunks, compute_dtype

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
CUBIC_COEFF = 0.044715


def _u_and_e(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """u = sqrt(2/pi) * (x + c x^3) and e = exp(-2|u|), both fresh tensors of x's dtype."""
    u = torch.mul(x, x).mul_(x).mul_(CUBIC_COEFF).add_(x).mul_(SQRT_2_OVER_PI)
    e = u.abs().mul_(-2.0).exp_()
    return u, e


def _sigmoid_2u(u: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    return torch.where(u >= 0, torch.ones_like(e), e).div_(e + 1.0)


def gelu_forward(x1d: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """GELU (tanh approximation) of a 1-D contiguous tensor, written as `out_dtype`."""
    if x1d.dim() != 1:
        raise ValueError(f"x1d must be 1-D, got shape {tuple(x1d.shape)}")
    compute = compute_dtype(x1d)
    y1d = torch.empty(x1d.shape, dtype=out_dtype, device=x1d.device)
    for sl in chunks(x1d.numel()):
        xc = x1d[sl].to(compute)  # may alias x1d when already `compute`: never modified in place
        u, e = _u_and_e(xc)
        y1d[sl] = _sigmoid_2u(u, e).mul_(xc)  # copy_ casts to out_dtype
    return y1d


def gelu_backward(dy1d: torch.Tensor, x1d: torch.Tensor, dx_dtype: torch.dtype) -> torch.Tensor:
    """dx = dy * y'(x) for 1-D tensors of the same length, written as `dx_dtype` (see the module docstring)."""
    if dy1d.dim() != 1 or dy1d.shape != x1d.shape:
        raise ValueError(f"dy1d {tuple(dy1d.shape)} and x1d {tuple(x1d.shape)} must be 1-D of the same shape")
    compute = compute_dtype(dy1d, x1d)
    dx1d = torch.empty(x1d.shape, dtype=dx_dtype, device=x1d.device)
    for sl in chunks(x1d.numel()):
        xc = x1d[sl].to(compute)
        dyc = dy1d[sl].to(compute)
        u, e = _u_and_e(xc)
        s = _sigmoid_2u(u, e)
        s_one_minus_s = e / (e + 1.0).square_()
        du_dx = torch.mul(xc, xc).mul_(3.0 * CUBIC_COEFF).add_(1.0).mul_(SQRT_2_OVER_PI)
        dydx = s_one_minus_s.mul_(du_dx).mul_(xc).mul_(2.0).add_(s)
        dx1d[sl] = dydx.mul_(dyc)
    return dx1d
