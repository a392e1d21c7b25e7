"""Triton RMSNorm kernels and their launchers, on 2-D contiguous row-major tensors [rows, cols].

Why this exists: the stock LlamaRMSNorm is five eager ops (cast to fp32, square, mean, rsqrt-multiply, cast back,
weight multiply), each a full read and write of the hidden states, plus their backward. These kernels read a row
once, keep it in registers and write once: forward reads x and writes y; backward reads dy and x, writes dx and
accumulates dweight.

One program per row (forward) holds the whole row in registers (BLOCK = next_power_of_2(cols)); hidden sizes of
real models (768 to 16384) all fit. The backward runs a fixed number of programs, each looping over a contiguous
range of rows and accumulating its share of dweight in registers; the per-program partial sums (fp32) are then
added with one torch.sum. rstd is recomputed in the backward from x, which is loaded anyway.

This module imports triton at import time; import it only when triton is installed (see op.py). Under
TRITON_INTERPRET=1 (set before triton is first imported) the kernels also run on CPU tensors, for tests.
"""


import torch
import triton
import triton.language as tl

from .._launch import launch, next_power_of_2, cdiv

# Longest row one program holds in registers: 64K fp32 values over 16 warps is 128 per thread, the practical limit.
MAX_COLS = 65536
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Kernel names start with "_rmsnorm_fwd" / "_rmsnorm_bwd": patch.py's kernel_names look for these prefixes in
# profiler traces to prove the kernels ran. Rename both together.


@triton.jit
def _rmsnorm_fwd_kernel(x_ptr, w_ptr, y_ptr, n_cols, eps, BLOCK: tl.constexpr):
    # One program = one row. int64 row offset: rows * cols can exceed 2**31.
    row_start = tl.program_id(0).to(tl.int64) * n_cols
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row_start + cols, mask=mask, other=0.0).to(tl.float32)  # (BLOCK,)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    # Round the normalised row to x's dtype before the weight multiply, as LlamaRMSNorm does.
    normed = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row_start + cols, (normed * w).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_bwd_kernel(dy_ptr, x_ptr, w_ptr, dx_ptr, dw_partial_ptr, n_rows, n_cols, rows_per_program, eps,
                        BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)  # (BLOCK,)
    dw_acc = tl.zeros((BLOCK,), tl.float32)
    # int64 bounds make the loop variable int64, so row * n_cols cannot overflow.
    first = pid.to(tl.int64) * rows_per_program
    last = tl.minimum(first + rows_per_program, n_rows)
    for row in range(first, last):
        row_start = row * n_cols
        x = tl.load(x_ptr + row_start + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row_start + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        normed = x * rstd
        # dweight sees the normalised row as the forward rounded it.
        dw_acc += dy * normed.to(x_ptr.dtype.element_ty).to(tl.float32)
        g = dy * w
        dx = rstd * (g - normed * (tl.sum(g * normed, axis=0) / n_cols))
        tl.store(dx_ptr + row_start + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    tl.store(dw_partial_ptr + pid.to(tl.int64) * n_cols + cols, dw_acc, mask=mask)


def _num_warps(block: int) -> int:
    # About 8-16 fp32 values per thread per operand.
    if block <= 2048:
        return 4
    if block <= 8192:
        return 8
    return 16


def _check_inputs(x2d: torch.Tensor, weight: torch.Tensor) -> None:
    if x2d.dim() != 2 or not x2d.is_contiguous():
        raise ValueError(f"x2d must be a 2-D contiguous tensor, got shape {tuple(x2d.shape)} strides {x2d.stride()}")
    if weight.dim() != 1 or weight.shape[0] != x2d.shape[1] or not weight.is_contiguous():
        raise ValueError(f"weight must be 1-D contiguous [{x2d.shape[1]}], got shape {tuple(weight.shape)}")
    for name, t in (("x2d", x2d), ("weight", weight)):
        if t.dtype not in KERNEL_DTYPES:
            raise TypeError(f"{name}: Triton RMSNorm supports {KERNEL_DTYPES}, got {t.dtype}")
    if x2d.shape[1] > MAX_COLS:
        raise ValueError(f"Triton RMSNorm holds a row in registers: at most {MAX_COLS} columns, got {x2d.shape[1]}")


def rmsnorm_forward(x2d: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = weight * round_to_x_dtype(x * rstd) per row, fp32 math; output dtype promote_types(x, weight)."""
    _check_inputs(x2d, weight)
    rows, cols = x2d.shape
    y2d = torch.empty((rows, cols), dtype=torch.promote_types(x2d.dtype, weight.dtype), device=x2d.device)
    if rows == 0 or cols == 0:
        return y2d
    block = next_power_of_2(cols)
    launch(_rmsnorm_fwd_kernel, (rows,), x2d, weight, y2d, cols, eps, BLOCK=block, num_warps=_num_warps(block))
    return y2d


def rmsnorm_backward(dy2d: torch.Tensor, x2d: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx in x's dtype, dweight in the weight's dtype); dy2d is 2-D contiguous like x2d (any kernel dtype)."""
    _check_inputs(x2d, weight)
    if dy2d.shape != x2d.shape or not dy2d.is_contiguous() or dy2d.dtype not in KERNEL_DTYPES:
        raise ValueError(f"dy2d must be contiguous {tuple(x2d.shape)} in {KERNEL_DTYPES}, got "
                         f"{tuple(dy2d.shape)} {dy2d.dtype} strides {dy2d.stride()}")
    rows, cols = x2d.shape
    dx2d = torch.empty((rows, cols), dtype=x2d.dtype, device=x2d.device)
    if rows == 0 or cols == 0:
        return dx2d, torch.zeros(cols, dtype=weight.dtype, device=weight.device)
    programs = _backward_programs(rows, x2d.device)
    rows_per_program = cdiv(rows, programs)
    programs = cdiv(rows, rows_per_program)  # no idle program writes a partial row
    dw_partial = torch.empty((programs, cols), dtype=torch.float32, device=x2d.device)  # (P, cols)
    block = next_power_of_2(cols)
    launch(_rmsnorm_bwd_kernel, (programs,), dy2d, x2d, weight, dx2d, dw_partial, rows, cols, rows_per_program, eps,
           BLOCK=block, num_warps=_num_warps(block))
    return dx2d, dw_partial.sum(dim=0).to(weight.dtype)


def _backward_programs(rows: int, device: torch.device) -> int:
    # Enough programs to fill the GPU a few times over; more would only grow the partial-sum buffer.
    if device.type == "cuda":
        return min(rows, 4 * torch.cuda.get_device_properties(device).multi_processor_count)
    return min(rows, 8)  # the interpreter runs programs one by one: a few exercise the partial-sum path
