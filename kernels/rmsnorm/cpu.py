"""CPU RMSNorm built from elementwise torch primitives, on 2-D contiguous tensors [rows, cols].

A real implementation, not LlamaRMSNorm relabelled: the tool must be able to tell that this code (and not the stock
module) ran. Same contract as the Triton launchers: read x and the weight in their own dtypes, compute in fp32 (fp64
when an input is fp64), round the normalised row to x's dtype before the weight multiply (as transformers does), and
write the promoted dtype of x and the weight.
"""

import torch

from .._cpu_math import compute_dtype, row_chunks


def _normalise(xc: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x * rstd, rstd) for rows of xc, rstd = 1 / sqrt(mean(x^2) + eps); xc is already in the compute dtype."""
    rstd = torch.mul(xc, xc).mean(dim=1, keepdim=True).add_(eps).rsqrt_()  # (r, 1)
    return torch.mul(xc, rstd), rstd


def rmsnorm_forward(x2d: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = weight * round_to_x_dtype(x / sqrt(mean(x^2) + eps)) over the last dim of a 2-D tensor [rows, cols].

    Output dtype: torch.promote_types(x.dtype, weight.dtype), what `weight * normed.to(x.dtype)` gives in transformers.
    """
    _check_shapes(x2d, weight)
    rows, cols = x2d.shape
    compute = compute_dtype(x2d, weight)
    y2d = torch.empty((rows, cols), dtype=torch.promote_types(x2d.dtype, weight.dtype), device=x2d.device)
    if rows == 0 or cols == 0:
        return y2d
    w = weight.to(compute)  # (cols,)
    for sl in row_chunks(rows, cols):
        normed, _ = _normalise(x2d[sl].to(compute), eps)  # (r, cols)
        # The stock module casts the normalised fp32 row back to the input dtype before multiplying.
        normed = normed.to(x2d.dtype).to(compute)
        y2d[sl] = normed.mul_(w)  # copy_ casts to the output dtype
    return y2d


def rmsnorm_backward(dy2d: torch.Tensor, x2d: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx in x's dtype, dweight in the weight's dtype) for rmsnorm_forward, computed in fp32 (fp64 for fp64 inputs).

    With n = x * rstd and g = dy * weight:  dx = rstd * (g - n * mean(g * n)),  dweight = sum over rows of dy * n,
    where the n in dweight is rounded to x's dtype exactly as the forward rounded it. rstd is recomputed from x
    instead of saved: the row of x is read anyway.
    """
    _check_shapes(x2d, weight)
    if dy2d.shape != x2d.shape:
        raise ValueError(f"dy2d {tuple(dy2d.shape)} and x2d {tuple(x2d.shape)} must have the same shape")
    rows, cols = x2d.shape
    compute = compute_dtype(dy2d, x2d, weight)
    dx2d = torch.empty((rows, cols), dtype=x2d.dtype, device=x2d.device)
    dw = torch.zeros(cols, dtype=compute, device=x2d.device)
    if rows == 0 or cols == 0:
        return dx2d, dw.to(weight.dtype)
    w = weight.to(compute)  # (cols,)
    for sl in row_chunks(rows, cols):
        dyc = dy2d[sl].to(compute)  # (r, cols)
        normed, rstd = _normalise(x2d[sl].to(compute), eps)  # (r, cols), (r, 1)
        dw += torch.mul(dyc, normed.to(x2d.dtype).to(compute)).sum(dim=0)
        g = torch.mul(dyc, w)  # not in place: dyc may alias the caller's dy when dy is already `compute`
        dot = torch.mul(g, normed).mean(dim=1, keepdim=True)  # (r, 1)
        dx2d[sl] = g.sub_(normed.mul_(dot)).mul_(rstd)
    return dx2d, dw.to(weight.dtype)


def _check_shapes(x2d: torch.Tensor, weight: torch.Tensor) -> None:
    if x2d.dim() != 2 or weight.dim() != 1 or weight.shape[0] != x2d.shape[1]:
        raise ValueError(f"x2d must be 2-D [rows, cols] and weight 1-D [cols], got {tuple(x2d.shape)} and "
                         f"{tuple(weight.shape)}")
