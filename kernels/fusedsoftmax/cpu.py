"""CPU implementation of the fused "scale + additive mask + softmax" and its backward, from torch primitives.

A real implementation, not the stock attention chain relabelled: the tool must be able to tell that this code ran,
and its numerics are ours to test. Same contract as the Triton launchers: read the scores in their own dtype,
compute in fp32 (fp64 when any input is fp64), write the requested dtype; same -inf/NaN semantics as torch.softmax.
"""

import torch

from .._cpu_math import compute_dtype


def fused_softmax_forward(scores: torch.Tensor, mask: torch.Tensor | None, scale: float,
                          out_dtype: torch.dtype) -> torch.Tensor:
    """softmax(scale * scores + mask, dim=-1) of (B, H, T, S) scores, written as `out_dtype`.

    mask: None or a tensor expanded (as a view) to the scores' shape. Worked one batch item at a time so the fp32
    temporaries stay one (H, T, S) slice, whatever the batch.
    """
    if scores.dim() != 4:
        raise ValueError(f"scores must be 4-D (B, H, T, S), got shape {tuple(scores.shape)}")
    compute = compute_dtype(scores, mask)
    y = torch.empty(scores.shape, dtype=out_dtype, device=scores.device)
    if y.numel() == 0:
        return y
    for b in range(scores.shape[0]):
        z = scores[b].to(compute) * scale  # (H, T, S); a new tensor, so the in-place ops below never touch scores
        if mask is not None:
            z.add_(mask[b])  # (H, T, S) view, strides 0 where broadcast; promoted to `compute` by add_
        m = z.amax(dim=-1, keepdim=True)  # (H, T, 1); an all -inf row gives -inf - -inf = NaN, as torch does
        e = z.sub_(m).exp_()
        y[b] = e.div_(e.sum(dim=-1, keepdim=True))  # copy_ casts to out_dtype
    return y


def fused_softmax_backward(grad_out: torch.Tensor, out: torch.Tensor, scale: float,
                           in_dtype: torch.dtype) -> torch.Tensor:
    """Gradient w.r.t. the raw scores: scale * y * (dy - sum(dy * y, last dim)), written as `in_dtype`.

    Masked positions have y == 0 exactly, so their gradient is exactly 0.
    """
    if grad_out.shape != out.shape:
        raise ValueError(f"grad_out {tuple(grad_out.shape)} and out {tuple(out.shape)} must have the same shape")
    compute = compute_dtype(grad_out, out)
    dx = torch.empty(out.shape, dtype=in_dtype, device=out.device)
    if dx.numel() == 0:
        return dx
    for b in range(out.shape[0]):
        dy = grad_out[b].to(compute)  # (H, T, S)
        y = out[b].to(compute)
        dot = torch.mul(dy, y).sum(dim=-1, keepdim=True)  # (H, T, 1)
        dx[b] = torch.sub(dy, dot).mul_(y).mul_(scale)
    return dx
