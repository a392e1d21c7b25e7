"""CPU GELU, tanh approximation (GPT-2's `gelu_new`) and exact erf (BERT's `gelu`), built from elementwise torch
primitives, on flat 1-D tensors.

A real implementation, not torch's gelu relabelled: the tool must be able to tell that this code (and not the stock
op) ran, and its numerics are ours to test. Same contract and same formula as the Triton kernels: read x in its own
dtype, compute in fp32 (fp64 when the input is fp64), write the requested dtype.

The formula. 0.5 * (1 + tanh(u)) is sigmoid(2u), so with u = sqrt(2/pi) * (x + 0.044715 x^3):
    y   = x * s,                    s = sigmoid(2u)
    y'  = s + 2x * s(1-s) * du/dx,  du/dx = sqrt(2/pi) * (1 + 3 * 0.044715 x^2)
and with e = exp(-2|u|) in (0, 1] (never overflows), s = 1/(1+e) for u >= 0, e/(1+e) for u < 0, s(1-s) = e/(1+e)^2.
Unlike 1 + tanh(u), this never cancels for negative x. NaN in gives NaN out; x = +inf gives +inf and x = -inf gives
NaN (-inf * 0), as the stock formula does.

The exact (erf) GELU, with Phi the standard normal CDF and phi its density:
    y   = x * Phi(x),               Phi(x) = 0.5 * (1 + erf(x / sqrt(2)))
    y'  = Phi(x) + x * phi(x),      phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
Phi is computed as torch's own gelu computes it (and as the Triton kernel does: triton 3.6 has erf but no erfc in its
core math), so for x below about -4 the fp32 result keeps only a few digits of a value under 1e-4 of |x|: invisible in
a relative-norm error, and no worse than the stock op. NaN in gives NaN out; +inf gives +inf, -inf gives NaN.
"""

import math

import torch

from .._cpu_math import chunks, compute_dtype

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
CUBIC_COEFF = 0.044715
SQRT_HALF = math.sqrt(0.5)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
APPROXIMATIONS = ("tanh", "none")  # torch.nn.functional.gelu's names: "none" is the exact erf GELU


def _u_and_e(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """u = sqrt(2/pi) * (x + c x^3) and e = exp(-2|u|), both fresh tensors of x's dtype."""
    u = torch.mul(x, x).mul_(x).mul_(CUBIC_COEFF).add_(x).mul_(SQRT_2_OVER_PI)
    e = u.abs().mul_(-2.0).exp_()
    return u, e


def _sigmoid_2u(u: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    return torch.where(u >= 0, torch.ones_like(e), e).div_(e + 1.0)


def _tanh_value(xc: torch.Tensor) -> torch.Tensor:
    u, e = _u_and_e(xc)
    return _sigmoid_2u(u, e).mul_(xc)


def _tanh_slope(xc: torch.Tensor) -> torch.Tensor:
    u, e = _u_and_e(xc)
    s = _sigmoid_2u(u, e)
    s_one_minus_s = e / (e + 1.0).square_()
    du_dx = torch.mul(xc, xc).mul_(3.0 * CUBIC_COEFF).add_(1.0).mul_(SQRT_2_OVER_PI)
    return s_one_minus_s.mul_(du_dx).mul_(xc).mul_(2.0).add_(s)


def _normal_cdf(x: torch.Tensor) -> torch.Tensor:
    """Phi(x) = 0.5 * (1 + erf(x / sqrt(2))), a fresh tensor."""
    return torch.mul(x, SQRT_HALF).erf_().add_(1.0).mul_(0.5)


def _erf_value(xc: torch.Tensor) -> torch.Tensor:
    return _normal_cdf(xc).mul_(xc)


def _erf_slope(xc: torch.Tensor) -> torch.Tensor:
    pdf = torch.mul(xc, xc).mul_(-0.5).exp_().mul_(INV_SQRT_2PI)  # underflows to 0 for large |x|, never overflows
    return pdf.mul_(xc).add_(_normal_cdf(xc))


# approximate -> (y(x), y'(x)), each taking one chunk in the compute dtype and returning a fresh tensor.
_FORMULAS = {"tanh": (_tanh_value, _tanh_slope), "none": (_erf_value, _erf_slope)}


def _formulas(approximate: str):
    if approximate not in _FORMULAS:
        raise ValueError(f"approximate must be one of {APPROXIMATIONS}, got {approximate!r}")
    return _FORMULAS[approximate]


def gelu_forward(x1d: torch.Tensor, out_dtype: torch.dtype, approximate: str = "tanh") -> torch.Tensor:
    """GELU of a 1-D contiguous tensor, written as `out_dtype`; approximate "tanh" or "none" (erf), as in F.gelu."""
    if x1d.dim() != 1:
        raise ValueError(f"x1d must be 1-D, got shape {tuple(x1d.shape)}")
    value, _ = _formulas(approximate)
    compute = compute_dtype(x1d)
    y1d = torch.empty(x1d.shape, dtype=out_dtype, device=x1d.device)
    for sl in chunks(x1d.numel()):
        xc = x1d[sl].to(compute)  # may alias x1d when already `compute`: never modified in place
        y1d[sl] = value(xc)  # copy_ casts to out_dtype
    return y1d


def gelu_backward(dy1d: torch.Tensor, x1d: torch.Tensor, dx_dtype: torch.dtype, approximate: str = "tanh"
                  ) -> torch.Tensor:
    """dx = dy * y'(x) for 1-D tensors of the same length, written as `dx_dtype` (see the module docstring)."""
    if dy1d.dim() != 1 or dy1d.shape != x1d.shape:
        raise ValueError(f"dy1d {tuple(dy1d.shape)} and x1d {tuple(x1d.shape)} must be 1-D of the same shape")
    _, slope = _formulas(approximate)
    compute = compute_dtype(dy1d, x1d)
    dx1d = torch.empty(x1d.shape, dtype=dx_dtype, device=x1d.device)
    for sl in chunks(x1d.numel()):
        xc = x1d[sl].to(compute)
        dx1d[sl] = slope(xc).mul_(dy1d[sl].to(compute))
    return dx1d
