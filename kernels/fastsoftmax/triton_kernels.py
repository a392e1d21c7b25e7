"""Triton softmax kernels and their launchers, on contiguous tensors whose rows are the last dim.

Why this exists: under CUDA autocast, eager attention casts bf16 scores to fp32 (one full read + write) and then
softmaxes the fp32 copy (another read + write). These kernels read the scores in their own dtype, accumulate in
fp32 and write the requested output dtype in one pass.

Two strategies, picked by row length:
- one row per program, the whole row in registers (BLOCK = next_power_of_2(cols)): one read, one write;
- a looped kernel for longer rows: an online max/sum over column tiles, then a second pass that writes.

-inf/NaN semantics match torch.softmax: a row of all -inf gives NaN (-inf - -inf), any NaN or +inf in a row makes
the whole row NaN. Masked lanes load -inf (forward) or 0 (backward) so they add nothing to a row's sum.

This module imports triton at import time; import it only when triton is installed (see op.py). Under
TRITON_INTERPRET=1 (set before triton is first imported) the kernels also run on CPU tensors, for tests.
"""

import torch
import triton
import triton.language as tl

from .._launch import launch, next_power_of_2

# Longest row held in registers by one program. Backward holds two operands (dy, y) per lane, so its limit is half.
MAX_FUSED_COLS_FWD = 16384
MAX_FUSED_COLS_BWD = 8192
# Column tile of the looped kernels: 4096 fp32 lanes over 8 warps = 16 registers per thread per operand.
LOOP_BLOCK = 4096
LOOP_WARPS = 8

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Kernel names start with "_softmax_fwd" / "_softmax_bwd": patch.py's kernel_names look for these prefixes in
# profiler traces to prove the kernels ran. Rename both together.


@triton.jit
def _softmax_fwd_row_kernel(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    # One program = one row. int64 row offset: rows * cols can exceed 2**31 on attention-sized inputs.
    row_start = tl.program_id(0).to(tl.int64) * n_cols
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row_start + cols, mask=mask, other=-float("inf")).to(tl.float32)  # (BLOCK,)
    m = tl.max(x, axis=0)
    # All -inf row: m = -inf, x - m = NaN, like torch. Masked lanes give exp(-inf) = 0 when m is finite.
    e = tl.exp(x - m)
    s = tl.sum(e, axis=0)
    y = e / s
    tl.store(y_ptr + row_start + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_fwd_looped_kernel(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row_start = tl.program_id(0).to(tl.int64) * n_cols
    cols = tl.arange(0, BLOCK)
    # Pass 1: online max and rescaled sum, kept per lane (no cross-lane reduction inside the loop).
    m_vec = tl.full((BLOCK,), -float("inf"), tl.float32)
    s_vec = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        x = tl.load(x_ptr + row_start + offs, mask=offs < n_cols, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m_vec, x)
        # A lane that has seen only -inf must keep s = 0; exp(-inf - -inf) would poison it with NaN even though
        # the row may still hold finite values. Shifting by 0 there gives exp(-inf) = 0 for both terms.
        # NaN or +inf inputs still make s NaN, which then spreads to the whole row as in torch.
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        s_vec = s_vec * tl.exp(m_vec - m_safe) + tl.exp(x - m_safe)
        m_vec = m_new
    m = tl.max(m_vec, axis=0)
    # All -inf row: m = -inf, exp(-inf - -inf) = NaN, so s and every output are NaN, like torch.
    s = tl.sum(s_vec * tl.exp(m_vec - m), axis=0)
    # Pass 2: normalise and write.
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        mask = offs < n_cols
        x = tl.load(x_ptr + row_start + offs, mask=mask, other=-float("inf")).to(tl.float32)
        y = tl.exp(x - m) / s
        tl.store(y_ptr + row_start + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_bwd_row_kernel(dy_ptr, y_ptr, dx_ptr, n_cols, BLOCK: tl.constexpr):
    row_start = tl.program_id(0).to(tl.int64) * n_cols
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    dy = tl.load(dy_ptr + row_start + cols, mask=mask, other=0.0).to(tl.float32)  # (BLOCK,)
    y = tl.load(y_ptr + row_start + cols, mask=mask, other=0.0).to(tl.float32)  # (BLOCK,)
    dot = tl.sum(dy * y, axis=0)
    dx = y * (dy - dot)
    tl.store(dx_ptr + row_start + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_bwd_looped_kernel(dy_ptr, y_ptr, dx_ptr, n_cols, BLOCK: tl.constexpr):
    row_start = tl.program_id(0).to(tl.int64) * n_cols
    cols = tl.arange(0, BLOCK)
    # Pass 1: per-lane partial sums of dy * y, reduced once after the loop.
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        mask = offs < n_cols
        dy = tl.load(dy_ptr + row_start + offs, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + row_start + offs, mask=mask, other=0.0).to(tl.float32)
        acc += dy * y
    dot = tl.sum(acc, axis=0)
    # Pass 2: dx = y * (dy - dot).
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        mask = offs < n_cols
        dy = tl.load(dy_ptr + row_start + offs, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + row_start + offs, mask=mask, other=0.0).to(tl.float32)
        dx = y * (dy - dot)
        tl.store(dx_ptr + row_start + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)


def _num_warps(block: int) -> int:
    # Keep about 8-16 fp32 values per thread per operand: fewer warps starve long rows, more waste short ones.
    # Rows up to 1024 get 2 warps: at GPT-2's shape they came closer to the copy roofline than 4 warps, and several
    # rows per program did no better (benchmarks/tune_fastsoftmax.py; reports/2026-12-02-h200-fastsoftmax-tuning/).
    if block <= 1024:
        return 2
    if block <= 2048:
        return 4
    if block <= 8192:
        return 8
    return 16


def _check_rows(name: str, t: torch.Tensor) -> None:
    if t.dim() == 0 or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous tensor of at least one dim, got shape {tuple(t.shape)} "
                         f"strides {t.stride()}")
    if t.dtype not in KERNEL_DTYPES:
        raise TypeError(f"{name}: Triton softmax supports {KERNEL_DTYPES}, got {t.dtype}")


def _check_out_dtype(name: str, dtype: torch.dtype) -> None:
    if dtype not in KERNEL_DTYPES:
        raise TypeError(f"{name}: Triton softmax writes {KERNEL_DTYPES}, got {dtype}")


def softmax_forward(x2d: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """Softmax over the last dim of a contiguous tensor: [rows, cols], or any shape whose last dim is the row (the
    attention scores as they come, with no view or copy on the host).

    Reads x in its own dtype (fp32/bf16/fp16), accumulates in fp32 and writes `out_dtype` in one pass.
    Returns a new contiguous tensor of x's shape; empty inputs return an empty output without a launch.
    """
    _check_rows("x2d", x2d)
    _check_out_dtype("out_dtype", out_dtype)
    cols = x2d.shape[-1]
    y2d = torch.empty_like(x2d, dtype=out_dtype, memory_format=torch.contiguous_format)
    rows = x2d.numel() // cols if cols else 0
    if rows == 0:
        return y2d
    if cols <= MAX_FUSED_COLS_FWD:
        block = next_power_of_2(cols)
        launch(_softmax_fwd_row_kernel, (rows,), x2d, y2d, cols, BLOCK=block, num_warps=_num_warps(block))
    else:
        launch(_softmax_fwd_looped_kernel, (rows,), x2d, y2d, cols, BLOCK=LOOP_BLOCK, num_warps=LOOP_WARPS)
    return y2d


def softmax_backward(dy2d: torch.Tensor, y2d: torch.Tensor, dx_dtype: torch.dtype) -> torch.Tensor:
    """Softmax backward over the last dim: dx = y * (dy - sum(dy * y, row)), in fp32, written as `dx_dtype`.

    dy2d and y2d are contiguous tensors of the same shape, rows along the last dim (their dtypes may differ).
    """
    _check_rows("dy2d", dy2d)
    _check_rows("y2d", y2d)
    _check_out_dtype("dx_dtype", dx_dtype)
    if dy2d.shape != y2d.shape:
        raise ValueError(f"dy2d {tuple(dy2d.shape)} and y2d {tuple(y2d.shape)} must have the same shape")
    cols = y2d.shape[-1]
    dx2d = torch.empty_like(y2d, dtype=dx_dtype, memory_format=torch.contiguous_format)
    rows = y2d.numel() // cols if cols else 0
    if rows == 0:
        return dx2d
    if cols <= MAX_FUSED_COLS_BWD:
        block = next_power_of_2(cols)
        launch(_softmax_bwd_row_kernel, (rows,), dy2d, y2d, dx2d, cols, BLOCK=block, num_warps=_num_warps(block))
    else:
        launch(_softmax_bwd_looped_kernel, (rows,), dy2d, y2d, dx2d, cols, BLOCK=LOOP_BLOCK, num_warps=LOOP_WARPS)
    return dx2d

