"""CPU softmax built from elementwise torch primitives, on 2-D contiguous tensors [rows, cols].

A real implementation, not torch.softmax relabelled: the tool must be able to tell that this code (and not the stock
op) ran, and its numerics are ours to test. Same contract as the Triton launchers: read x in its own dtype, compute
in fp32 (fp64 when the input is fp64), write the requested dtype; same -inf/NaN semantics as torch.softmax.
"""

import torch

from .._cpu_math import CHUNK_ELEMENTS, compute_dtype, row_chunks


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
    if rows * cols <= CHUNK_ELEMENTS:  # one chunk: no slicing, which costs host time on small tensors
        return y2d.copy_(_softmax_rows(x2d.to(compute)))
    for sl in row_chunks(rows, cols):
        y2d[sl] = _softmax_rows(x2d[sl].to(compute))  # copy_ casts to out_dtype
    return y2d


def _softmax_rows(xc: torch.Tensor) -> torch.Tensor:
    """Softmax over dim 1 of xc (r, cols), a fresh tensor; xc may alias the input, so it is never modified."""
    m = xc.amax(dim=1, keepdim=True)  # (r, 1)
    e = torch.sub(xc, m).exp_()  # fresh tensor: in-place exp is safe
    return e.div_(e.sum(dim=1, keepdim=True))


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
    if rows * cols <= CHUNK_ELEMENTS:  # one chunk: no slicing
        return dx2d.copy_(_backward_rows(dy2d.to(compute), y2d.to(compute)))
    for sl in row_chunks(rows, cols):
        dx2d[sl] = _backward_rows(dy2d[sl].to(compute), y2d[sl].to(compute))
    return dx2d


def _backward_rows(dyc: torch.Tensor, yc: torch.Tensor) -> torch.Tensor:
    """dy * y - y * sum(dy * y) over dim 1 of (r, cols) tensors, as a fresh tensor."""
    dot = torch.mul(dyc, yc).sum(dim=1, keepdim=True)  # (r, 1)
    return torch.sub(dyc, dot).mul_(yc)
