"""Triton kernels for attention's "scale + additive mask + softmax" in one pass, and its backward.

Why this exists: GPT-2's eager attention computes `softmax(scores * scale + mask).type(value.dtype)` as four
full passes over the (B, nh, T, S) scores: a multiply, an add that promotes bf16 scores to the fp32 mask's dtype
(autocast), the softmax, and a cast back. These kernels read the raw scores once (bf16/fp16/fp32), scale and add
the mask in fp32 registers, and write the probabilities once in the dtype the stock chain ends with.

Layout: scores are a contiguous (B, H, T, S) tensor seen as rows of S; program `row` handles (b, h, t) with
row = (b * H + h) * T + t. The mask is any tensor broadcastable to (B, H, T, S), passed with its four strides
(0 on broadcast dims), so a (B, 1, T, S) causal+padding mask is read in place, never expanded in memory.

Two strategies, picked by row length (S): the whole row in registers (one read, one write), or a looped kernel
with an online max/sum over column tiles and a second pass that writes. -inf/NaN follow torch: a row whose
every logit is -inf is NaN, a NaN logit makes its row NaN.

Import this module only when triton is installed (see op.py). Under TRITON_INTERPRET=1 (set before triton is
first imported) the kernels also run on CPU tensors, for tests.
"""


import torch
import triton
import triton.language as tl

from .._launch import launch, next_power_of_2

# Longest row held in registers by one program; backward holds two operands per lane, so its limit is half.
MAX_FUSED_COLS_FWD = 16384
MAX_FUSED_COLS_BWD = 8192
# Column tile of the looped kernels: 4096 fp32 lanes over 8 warps = 16 registers per thread per operand.
LOOP_BLOCK = 4096
LOOP_WARPS = 8

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Kernel names start with "_fusedsoftmax_fwd" / "_fusedsoftmax_bwd": patch.py's kernel_names look for these
# prefixes in profiler traces to prove the kernels ran. Rename both together.


@triton.jit
def _logits(x_ptr, mask_ptr, row, row_start, offs, valid, n_heads, n_queries, scale,
            msb, msh, mst, mss, HAS_MASK: tl.constexpr):
    """fp32 logits scale * x + mask for columns `offs` of row `row`; -inf outside the row."""
    z = tl.load(x_ptr + row_start + offs, mask=valid, other=0.0).to(tl.float32) * scale
    if HAS_MASK:
        t = row % n_queries
        bh = row // n_queries
        m_start = (bh // n_heads) * msb + (bh % n_heads) * msh + t * mst
        z += tl.load(mask_ptr + m_start + offs * mss, mask=valid, other=0.0).to(tl.float32)
    return tl.where(valid, z, -float("inf"))


@triton.jit
def _fusedsoftmax_fwd_row_kernel(x_ptr, mask_ptr, y_ptr, n_cols, n_heads, n_queries, scale,
                                 msb, msh, mst, mss, HAS_MASK: tl.constexpr, BLOCK: tl.constexpr):
    # One program = one row. int64 row: B * H * T * S exceeds 2**31 at GPT-2 sizes beyond batch 16.
    row = tl.program_id(0).to(tl.int64)
    row_start = row * n_cols
    offs = tl.arange(0, BLOCK)
    valid = offs < n_cols
    z = _logits(x_ptr, mask_ptr, row, row_start, offs, valid, n_heads, n_queries, scale,
                msb, msh, mst, mss, HAS_MASK)  # (BLOCK,)
    m = tl.max(z, axis=0)
    # All -inf row: m = -inf, z - m = NaN, like torch. Lanes past the row give exp(-inf) = 0 when m is finite.
    e = tl.exp(z - m)
    y = e / tl.sum(e, axis=0)
    tl.store(y_ptr + row_start + offs, y.to(y_ptr.dtype.element_ty), mask=valid)


@triton.jit
def _fusedsoftmax_fwd_looped_kernel(x_ptr, mask_ptr, y_ptr, n_cols, n_heads, n_queries, scale,
                                    msb, msh, mst, mss, HAS_MASK: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_start = row * n_cols
    cols = tl.arange(0, BLOCK)
    # Pass 1: online max and rescaled sum, per lane (no cross-lane reduction inside the loop).
    m_vec = tl.full((BLOCK,), -float("inf"), tl.float32)
    s_vec = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        z = _logits(x_ptr, mask_ptr, row, row_start, offs, offs < n_cols, n_heads, n_queries, scale,
                    msb, msh, mst, mss, HAS_MASK)
        m_new = tl.maximum(m_vec, z)
        # A lane that has seen only -inf keeps s = 0: shifting by 0 there avoids exp(-inf - -inf) = NaN.
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        s_vec = s_vec * tl.exp(m_vec - m_safe) + tl.exp(z - m_safe)
        m_vec = m_new
    m = tl.max(m_vec, axis=0)
    s = tl.sum(s_vec * tl.exp(m_vec - m), axis=0)  # all -inf row: NaN, like torch
    # Pass 2: recompute the logits (cheaper than storing them), normalise and write.
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        valid = offs < n_cols
        z = _logits(x_ptr, mask_ptr, row, row_start, offs, valid, n_heads, n_queries, scale,
                    msb, msh, mst, mss, HAS_MASK)
        tl.store(y_ptr + row_start + offs, (tl.exp(z - m) / s).to(y_ptr.dtype.element_ty), mask=valid)


@triton.jit
def _fusedsoftmax_bwd_row_kernel(dy_ptr, y_ptr, dx_ptr, n_cols, scale, BLOCK: tl.constexpr):
    row_start = tl.program_id(0).to(tl.int64) * n_cols
    offs = tl.arange(0, BLOCK)
    valid = offs < n_cols
    dy = tl.load(dy_ptr + row_start + offs, mask=valid, other=0.0).to(tl.float32)  # (BLOCK,)
    y = tl.load(y_ptr + row_start + offs, mask=valid, other=0.0).to(tl.float32)  # (BLOCK,)
    dot = tl.sum(dy * y, axis=0)
    # d(scale * x + mask)/dx = scale. Masked positions have y == 0 exactly, so their gradient is exactly 0.
    dx = scale * (y * (dy - dot))
    tl.store(dx_ptr + row_start + offs, dx.to(dx_ptr.dtype.element_ty), mask=valid)


@triton.jit
def _fusedsoftmax_bwd_looped_kernel(dy_ptr, y_ptr, dx_ptr, n_cols, scale, BLOCK: tl.constexpr):
    row_start = tl.program_id(0).to(tl.int64) * n_cols
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), tl.float32)  # per-lane partial sums of dy * y, reduced once after the loop
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        valid = offs < n_cols
        dy = tl.load(dy_ptr + row_start + offs, mask=valid, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + row_start + offs, mask=valid, other=0.0).to(tl.float32)
        acc += dy * y
    dot = tl.sum(acc, axis=0)
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        valid = offs < n_cols
        dy = tl.load(dy_ptr + row_start + offs, mask=valid, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + row_start + offs, mask=valid, other=0.0).to(tl.float32)
        dx = scale * (y * (dy - dot))
        tl.store(dx_ptr + row_start + offs, dx.to(dx_ptr.dtype.element_ty), mask=valid)


def _num_warps(block: int) -> int:
    # About 8-16 fp32 values per thread per operand: fewer warps starve long rows, more waste short ones.
    if block <= 2048:
        return 4
    if block <= 8192:
        return 8
    return 16


def _check(name: str, dtype: torch.dtype) -> None:
    if dtype not in KERNEL_DTYPES:
        raise TypeError(f"{name}: the Triton fused softmax handles {KERNEL_DTYPES}, got {dtype}")


def fused_softmax_forward(scores: torch.Tensor, mask: torch.Tensor | None, scale: float,
                          out_dtype: torch.dtype) -> torch.Tensor:
    """softmax(scale * scores + mask, dim=-1) of contiguous (B, H, T, S) scores, written as `out_dtype`.

    mask: None, or a tensor already expanded (as a view, strides 0 where broadcast) to the scores' shape.
    Returns a new contiguous (B, H, T, S) tensor; an empty input returns an empty output without a launch.
    """
    if scores.dim() != 4 or not scores.is_contiguous():
        raise ValueError(f"scores must be a contiguous 4-D tensor, got shape {tuple(scores.shape)} "
                         f"strides {scores.stride()}")
    _check("scores", scores.dtype)
    _check("out_dtype", out_dtype)
    if mask is not None:
        _check("mask", mask.dtype)
        if mask.shape != scores.shape:
            raise ValueError(f"mask {tuple(mask.shape)} must be expanded to the scores' shape {tuple(scores.shape)}")
    B, H, T, S = scores.shape
    y = torch.empty((B, H, T, S), dtype=out_dtype, device=scores.device)
    rows = B * H * T
    if rows == 0 or S == 0:
        return y
    strides = mask.stride() if mask is not None else (0, 0, 0, 0)
    # Any valid pointer works when HAS_MASK is False: the kernel never reads it.
    mask_arg = mask if mask is not None else scores
    if S <= MAX_FUSED_COLS_FWD:
        block = next_power_of_2(S)
        launch(_fusedsoftmax_fwd_row_kernel, (rows,), scores, mask_arg, y, S, H, T, scale, *strides,
               HAS_MASK=mask is not None, BLOCK=block, num_warps=_num_warps(block))
    else:
        launch(_fusedsoftmax_fwd_looped_kernel, (rows,), scores, mask_arg, y, S, H, T, scale, *strides,
               HAS_MASK=mask is not None, BLOCK=LOOP_BLOCK, num_warps=LOOP_WARPS)
    return y


def fused_softmax_backward(grad_out: torch.Tensor, out: torch.Tensor, scale: float,
                           in_dtype: torch.dtype) -> torch.Tensor:
    """Gradient w.r.t. the raw scores: scale * y * (dy - sum(dy * y, row)), in fp32, written as `in_dtype`.

    grad_out and out are contiguous tensors of the same shape (dtypes may differ), rows along the last dim.
    """
    for name, t in (("grad_out", grad_out), ("out", out)):
        if t.dim() == 0 or not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous with at least one dim, got strides {t.stride()}")
        _check(name, t.dtype)
    _check("in_dtype", in_dtype)
    if grad_out.shape != out.shape:
        raise ValueError(f"grad_out {tuple(grad_out.shape)} and out {tuple(out.shape)} must have the same shape")
    dx = torch.empty(out.shape, dtype=in_dtype, device=out.device)
    cols = out.shape[-1]
    rows = out.numel() // cols if cols else 0
    if rows == 0:
        return dx
    if cols <= MAX_FUSED_COLS_BWD:
        block = next_power_of_2(cols)
        launch(_fusedsoftmax_bwd_row_kernel, (rows,), grad_out, out, dx, cols, scale, BLOCK=block,
               num_warps=_num_warps(block))
    else:
        launch(_fusedsoftmax_bwd_looped_kernel, (rows,), grad_out, out, dx, cols, scale, BLOCK=LOOP_BLOCK,
               num_warps=LOOP_WARPS)
    return dx
