"""CPU softmax built from elementwise torch primitives, on 2-D contiguous tensors [rows, cols].

A real implementation, not torch.softmax relabelled: the tool must be able to tell that this code (and not the stock
op) ran, and its numerics are ours to test. Same contract as the Triton launchers: read x in its own dtype, compute
in fp32 (fp64 when the input is fp64), write the requested dtype; same -inf/NaN semantics as torch.softmax.
"""

import torch

from .._cpu_math import compute_dtype, row_chunks


def softmax_forward(x2d: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """Softmax over the last dim of a 2-D tensor [rows, cols], written as `out_dtype`.

    y = exp(x - max(x)) / sum(exp(x - max(x))) in fp32 (fp64 for fp64 input). A row of all -inf gives NaN
    (-inf - -inf), a NaN anywhere in a row makes the row NaN (amax propagates NaN), as in torch.softmax.
    """
    if x2d.dim() != 2:
        raise ValueError(f"x2d must be 2-D, got shape {tuple(x2d.shape)}")
    rows, cols = x2d.shape
    compute = compute_dtype(x2d)
    y2d = torch.empty((rows, cols), dtype=out_dtype, device=x2d.device)
    if rows == 0 or cols == 0:
        return y2d
    for sl in row_chunks(rows, cols):
        xc = x2d[sl].to(compute)  # (r, cols); may alias x2d when already `compute`, so never modified in place
        m = xc.amax(dim=1, keepdim=True)  # (r, 1)
        e = torch.sub(xc, m).exp_()  # fresh tensor: in-place exp is safe
        s = e.sum(dim=1, keepdim=True)  # (r, 1)
        y2d[sl] = e.div_(s)  # copy_ casts to out_dtype
    return y2d


def softmax_backward(dy2d: torch.Tensor, y2d: torch.Tensor, dx_dtype: torch.dtype) -> torch.Tensor:
    """Softmax backward over the last dim: dx = y * (dy - sum(dy * y, row)), written as `dx_dtype`.

    Computed in fp32 (fp64 when dy or y is fp64).
    """
    if dy2d.dim() != 2 or dy2d.shape != y2d.shape:
        raise ValueError(f"dy2d {tuple(dy2d.shape)} and y2d {tuple(y2d.shape)} must be 2-D of the same shape")
    rows, cols = y2d.shape
    compute = compute_dtype(dy2d, y2d)
    dx2d = torch.empty((rows, cols), dtype=dx_dtype, device=y2d.device)
    if rows == 0 or cols == 0:
        return dx2d
    for sl in row_chunks(rows, cols):
        dyc = dy2d[sl].to(compute)  # (r, cols)
        yc = y2d[sl].to(compute)  # (r, cols)
        dot = torch.mul(dyc, yc).sum(dim=1, keepdim=True)  # (r, 1)
        dx2d[sl] = torch.sub(dyc, dot).mul_(yc)
    return dx2d
