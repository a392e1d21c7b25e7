"""CPU LayerNorm built from elementwise torch primitives and row reductions, on 2-D contiguous tensors [rows, cols].

A real implementation, not torch's layer_norm relabelled: the tool must be able to tell that this code (and not the
stock op) ran, and its numerics are ours to test. Same contract as the Triton launchers: read x (and weight, bias)
in their own dtypes, compute in fp32 (fp64 when any operand is fp64), write the requested dtype, and return the
per-row mean and 1/std (rstd) that backward needs, in the compute dtype.

    mean = sum(x) / N,  var = sum((x - mean)^2) / N (biased, as torch),  rstd = 1 / sqrt(var + eps)
    xhat = (x - mean) * rstd,  y = xhat * w + b
Backward, with g = dy * w:  dx = rstd * (g - xhat * mean(g * xhat) - mean(g)),  dw = sum_rows(dy * xhat),
db = sum_rows(dy). Variance is computed from centred values (two passes), never as E[x^2] - E[x]^2, which cancels
when |mean| >> std.
"""

import torch

from .._cpu_math import compute_dtype, row_chunks


def layer_norm_forward(x2d: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
                       out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LayerNorm over the last dim of [rows, cols]; weight and bias are [cols] or None. Returns (y, mean, rstd)."""
    if x2d.dim() != 2:
        raise ValueError(f"x2d must be 2-D, got shape {tuple(x2d.shape)}")
    rows, cols = x2d.shape
    compute = compute_dtype(x2d, weight, bias)
    y2d = torch.empty((rows, cols), dtype=out_dtype, device=x2d.device)
    mean = torch.empty((rows,), dtype=compute, device=x2d.device)
    rstd = torch.empty((rows,), dtype=compute, device=x2d.device)
    if rows == 0 or cols == 0:
        return y2d, mean.fill_(float("nan")), rstd.fill_(float("nan"))
    w = weight.to(compute) if weight is not None else None  # (cols,)
    b = bias.to(compute) if bias is not None else None  # (cols,)
    for sl in row_chunks(rows, cols):
        xc = x2d[sl].to(compute)  # (r, cols); may alias x2d when already `compute`: never modified in place
        m = xc.sum(dim=1, keepdim=True).div_(cols)  # (r, 1)
        if not bool(torch.isfinite(m).all()):  # a row near the dtype's largest summed past it: scale first
            m = torch.where(torch.isfinite(m), m, xc.mul(1.0 / cols).sum(dim=1, keepdim=True))
        centred = torch.sub(xc, m)  # (r, cols), fresh
        var = centred.square().sum(dim=1, keepdim=True).div_(cols)  # (r, 1)
        r = var.add_(eps).rsqrt_()  # (r, 1)
        out = centred.mul_(r)  # xhat
        if w is not None:
            out.mul_(w)
        if b is not None:
            out.add_(b)
        y2d[sl] = out  # copy_ casts to out_dtype
        mean[sl] = m.squeeze(1)
        rstd[sl] = r.squeeze(1)
    return y2d, mean, rstd


def layer_norm_backward(dy2d: torch.Tensor, x2d: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                        weight: torch.Tensor | None, dx_dtype: torch.dtype, weight_dtype: torch.dtype,
                        bias_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dx [rows, cols], dweight [cols], dbias [cols]) from dy, x and the forward's mean and rstd [rows].

    dweight and dbias are always computed (a LayerNorm without weight or bias just discards them); row sums are
    accumulated in the compute dtype across chunks and cast once at the end.
    """
    if dy2d.dim() != 2 or dy2d.shape != x2d.shape:
        raise ValueError(f"dy2d {tuple(dy2d.shape)} and x2d {tuple(x2d.shape)} must be 2-D of the same shape")
    rows, cols = x2d.shape
    compute = compute_dtype(dy2d, x2d, weight)
    dx2d = torch.empty((rows, cols), dtype=dx_dtype, device=x2d.device)
    dw = torch.zeros((cols,), dtype=compute, device=x2d.device)
    db = torch.zeros((cols,), dtype=compute, device=x2d.device)
    if rows > 0 and cols > 0:
        w = weight.to(compute) if weight is not None else None  # (cols,)
        for sl in row_chunks(rows, cols):
            dyc = dy2d[sl].to(compute)  # (r, cols)
            r = rstd[sl].to(compute).unsqueeze(1)  # (r, 1)
            xhat = torch.sub(x2d[sl].to(compute), mean[sl].to(compute).unsqueeze(1)).mul_(r)  # (r, cols), fresh
            dw.add_(torch.mul(dyc, xhat).sum(dim=0))
            db.add_(dyc.sum(dim=0))
            g = torch.mul(dyc, w) if w is not None else dyc.clone()  # (r, cols), fresh: modified below
            c1 = torch.mul(g, xhat).sum(dim=1, keepdim=True).div_(cols)  # (r, 1)
            c2 = g.sum(dim=1, keepdim=True).div_(cols)  # (r, 1)
            dx2d[sl] = g.sub_(xhat.mul_(c1)).sub_(c2).mul_(r)
    return dx2d, dw.to(weight_dtype), db.to(bias_dtype)
