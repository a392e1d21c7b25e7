"""Triton LayerNorm kernels and their launchers, on contiguous tensors whose rows are the last dim.

Forward, one program per row, returns y and the per-row mean and rstd (fp32) that backward reuses:
- row kernel (cols <= MAX_FUSED_COLS_FWD): the row stays in registers: one read of x, one write of y;
- looped kernel for longer rows: a pass for the mean, one for the centred variance, one that writes.
Backward, a fixed number of programs each walking rows pid, pid + P, pid + 2P, ...: dx for each row, plus its own
fp32 partial sums of dy * xhat and dy per column, written once to a [2, P, cols] buffer (dweight's partials, then
dbias's) that one torch.sum reduces over P.
No atomics, so the result is deterministic; P is a few programs per SM, so the partials stay small.
- row kernel (cols <= MAX_FUSED_COLS_BWD): the row and the partials in registers;
- looped kernel: two passes per row over column tiles, the partials updated in the buffer tile by tile (only this
  program touches its buffer row, so a plain load-add-store is race-free).
The formulas are in cpu.py's docstring. Masked lanes load 0 and are zeroed after centring, so they add nothing.

This module imports triton at import time; import it only when triton is installed (see op.py). Under
TRITON_INTERPRET=1 (set before triton is first imported) the kernels also run on CPU tensors, for tests.
"""


import functools
import math

import torch
import triton
import triton.language as tl

from .._launch import launch, next_power_of_2

# Longest row held in registers by one program: forward holds x, weight and bias per lane, backward five vectors
# (dy, x, weight and two partial sums), so its limit is lower.
MAX_FUSED_COLS_FWD = 8192
MAX_FUSED_COLS_BWD = 4096
# Column tile of the looped kernels: 2048 fp32 lanes over 8 warps = 8 registers per thread per operand.
LOOP_BLOCK = 2048
LOOP_WARPS = 8
# Backward programs per SM: enough rows in flight to hide latency, few enough that the partials stay small.
BWD_PROGRAMS_PER_SM = 4
BWD_PROGRAMS_INTERPRETER = 4

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Kernel names start with "_layernorm_fwd" / "_layernorm_bwd": patch.py's kernel_names look for these prefixes in
# profiler traces to prove the kernels ran. Rename both together.


@triton.jit
def _layernorm_fwd_row_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, rstd_off, n_cols, eps,
                              HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, STORE_STATS: tl.constexpr,
                              BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_start = row * n_cols  # int64: rows * cols can exceed 2**31
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row_start + cols, mask=mask, other=0.0).to(tl.float32)  # (BLOCK,)
    # A row of values near fp32's largest sums past it, and an infinite mean would turn every output into NaN where
    # torch's layer_norm (a running mean) gives finite ones: then the mean of values scaled before the sum. Not
    # always: scaling denormal values first loses their low bits.
    total = tl.sum(x, axis=0)
    mean = tl.where(tl.abs(total) < float("inf"), total / n_cols, tl.sum(x * (1.0 / n_cols), axis=0))
    centred = tl.where(mask, x - mean, 0.0)
    var = tl.sum(centred * centred, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    y = centred * rstd
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y = y + tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row_start + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    if STORE_STATS:
        tl.store(mean_ptr + row, mean)
        tl.store(rstd_ptr + rstd_off + row, rstd)


@triton.jit
def _layernorm_fwd_looped_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, rstd_off, n_cols, eps,
                                 HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, STORE_STATS: tl.constexpr,
                                 BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_start = row * n_cols
    cols = tl.arange(0, BLOCK)
    # Pass 1: mean, from per-lane partial sums reduced once after the loop.
    acc = tl.zeros((BLOCK,), tl.float32)
    scaled = tl.zeros((BLOCK,), tl.float32)  # as in the row kernel: the mean where the plain sum overflows
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        x = tl.load(x_ptr + row_start + offs, mask=offs < n_cols, other=0.0).to(tl.float32)
        acc += x
        scaled += x * (1.0 / n_cols)
    total = tl.sum(acc, axis=0)
    mean = tl.where(tl.abs(total) < float("inf"), total / n_cols, tl.sum(scaled, axis=0))
    # Pass 2: variance of the centred values (no E[x^2] - E[x]^2 cancellation).
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        mask = offs < n_cols
        x = tl.load(x_ptr + row_start + offs, mask=mask, other=0.0).to(tl.float32)
        centred = tl.where(mask, x - mean, 0.0)
        acc += centred * centred
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)
    # Pass 3: normalise, scale, shift and write.
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        mask = offs < n_cols
        x = tl.load(x_ptr + row_start + offs, mask=mask, other=0.0).to(tl.float32)
        y = (x - mean) * rstd
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y = y + tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row_start + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
    if STORE_STATS:
        tl.store(mean_ptr + row, mean)
        tl.store(rstd_ptr + rstd_off + row, rstd)


@triton.jit
def _layernorm_bwd_row_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, rstd_off, dx_ptr, part_ptr,
                              n_rows, n_cols, HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)  # (BLOCK,)
    dw_acc = tl.zeros((BLOCK,), tl.float32)
    db_acc = tl.zeros((BLOCK,), tl.float32)
    for row in range(pid, n_rows, tl.num_programs(0)):
        row_start = tl.cast(row, tl.int64) * n_cols
        dy = tl.load(dy_ptr + row_start + cols, mask=mask, other=0.0).to(tl.float32)
        x = tl.load(x_ptr + row_start + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + row)
        rstd = tl.load(rstd_ptr + (tl.cast(row, tl.int64) + rstd_off))  # int64: 2 * rows may pass 2**31
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        g = dy
        if HAS_WEIGHT:
            g = dy * w
        c1 = tl.sum(g * xhat, axis=0) / n_cols
        c2 = tl.sum(g, axis=0) / n_cols
        dx = (g - (xhat * c1 + c2)) * rstd
        tl.store(dx_ptr + row_start + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw_acc += dy * xhat
        db_acc += dy
    # part is [2, P, cols]: this program's row of the dweight partials, and P rows further its dbias partials.
    part_start = tl.cast(pid, tl.int64) * n_cols
    db_start = tl.cast(tl.num_programs(0), tl.int64) * n_cols
    tl.store(part_ptr + part_start + cols, dw_acc, mask=mask)
    tl.store(part_ptr + db_start + part_start + cols, db_acc, mask=mask)


@triton.jit
def _layernorm_bwd_looped_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, rstd_off, dx_ptr, part_ptr,
                                 n_rows, n_cols, HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    part_start = tl.cast(pid, tl.int64) * n_cols  # this program's row of the zero-initialised partials [2, P, cols]
    db_start = tl.cast(tl.num_programs(0), tl.int64) * n_cols  # the dbias half
    for row in range(pid, n_rows, tl.num_programs(0)):
        row_start = tl.cast(row, tl.int64) * n_cols
        mean = tl.load(mean_ptr + row)
        rstd = tl.load(rstd_ptr + (tl.cast(row, tl.int64) + rstd_off))  # int64: 2 * rows may pass 2**31
        # Pass 1: the row's two reductions, mean(g * xhat) and mean(g).
        acc1 = tl.zeros((BLOCK,), tl.float32)
        acc2 = tl.zeros((BLOCK,), tl.float32)
        for start in range(0, n_cols, BLOCK):
            offs = start + cols
            mask = offs < n_cols
            dy = tl.load(dy_ptr + row_start + offs, mask=mask, other=0.0).to(tl.float32)
            x = tl.load(x_ptr + row_start + offs, mask=mask, other=0.0).to(tl.float32)
            xhat = tl.where(mask, (x - mean) * rstd, 0.0)
            g = dy
            if HAS_WEIGHT:
                g = dy * tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            acc1 += g * xhat
            acc2 += g
        c1 = tl.sum(acc1, axis=0) / n_cols
        c2 = tl.sum(acc2, axis=0) / n_cols
        # Pass 2: dx, and this row's contribution to the column partials.
        for start in range(0, n_cols, BLOCK):
            offs = start + cols
            mask = offs < n_cols
            dy = tl.load(dy_ptr + row_start + offs, mask=mask, other=0.0).to(tl.float32)
            x = tl.load(x_ptr + row_start + offs, mask=mask, other=0.0).to(tl.float32)
            xhat = tl.where(mask, (x - mean) * rstd, 0.0)
            g = dy
            if HAS_WEIGHT:
                g = dy * tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            dx = (g - (xhat * c1 + c2)) * rstd
            tl.store(dx_ptr + row_start + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
            dw = tl.load(part_ptr + part_start + offs, mask=mask, other=0.0)
            tl.store(part_ptr + part_start + offs, dw + dy * xhat, mask=mask)
            db = tl.load(part_ptr + db_start + part_start + offs, mask=mask, other=0.0)
            tl.store(part_ptr + db_start + part_start + offs, db + dy, mask=mask)


def _num_warps(block: int) -> int:
    # Keep about 8-16 fp32 values per thread per operand: fewer warps starve long rows, more waste short ones.
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
        raise TypeError(f"{name}: Triton LayerNorm supports {KERNEL_DTYPES}, got {t.dtype}")


def _check_param(name: str, t: torch.Tensor | None, cols: int) -> None:
    if t is None:
        return
    if t.shape != (cols,) or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous [{cols}] tensor, got shape {tuple(t.shape)}")
    if t.dtype not in KERNEL_DTYPES:
        raise TypeError(f"{name}: Triton LayerNorm supports {KERNEL_DTYPES}, got {t.dtype}")


def _check_out_dtype(name: str, dtype: torch.dtype) -> None:
    if dtype not in KERNEL_DTYPES:
        raise TypeError(f"{name}: Triton LayerNorm writes {KERNEL_DTYPES}, got {dtype}")


def layer_norm_forward(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
                       out_dtype: torch.dtype, packed: bool = False,
                       keep_stats: bool = True) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """LayerNorm over the last dim of a contiguous tensor: [rows, cols], or any shape whose last dim is the row (the
    hidden states as they come, with no view on the host); weight and bias are [cols] or None.

    Reads every operand in its own dtype (fp32/bf16/fp16), computes in fp32, writes y as `out_dtype`.
    Returns (y of x's shape, mean and rstd of x.shape[:-1] in fp32); empty inputs return without a launch.
    packed: (y, stats, None) instead, stats one contiguous [2, *x.shape[:-1]] fp32 tensor (the means, then the
    rstds): one allocation, and no views for autograd to save, for a caller that keeps the statistics to itself and
    hands them back to layer_norm_backward_unchecked as its mean, with rstd None. An op's outputs must not alias
    each other (opcheck's schema test says so), so an op returns them separate.
    keep_stats=False: no mean and rstd at all (None, None), for a forward no backward will follow: no allocation for
    them, and no statistics written.
    """
    _check_rows("x", x)
    cols = x.shape[-1]
    _check_param("weight", weight, cols)
    _check_param("bias", bias, cols)
    _check_out_dtype("out_dtype", out_dtype)
    # empty_like and new_empty: about half the host time of torch.empty(shape, dtype=, device=) per call.
    y = torch.empty_like(x, dtype=out_dtype, memory_format=torch.contiguous_format)
    batch = x.shape[:-1]
    rows = math.prod(batch)
    # The kernels store rstd at rstd_ptr + rstd_off + row: the packed buffer's second half, or a tensor of its own.
    if not keep_stats:
        mean = rstd = None
        m, r, rstd_off = y, y, 0  # never touched (STORE_STATS is a compile-time False); y stands in
    elif packed:
        mean, rstd = x.new_empty((2, *batch), dtype=torch.float32), None
        m, r, rstd_off = mean, mean, rows
    else:
        mean, rstd = x.new_empty(batch, dtype=torch.float32), x.new_empty(batch, dtype=torch.float32)
        m, r, rstd_off = mean, rstd, 0
    if rows == 0 or cols == 0:
        for stats in (mean, rstd):
            if stats is not None:
                stats.fill_(float("nan"))
        return y, mean, rstd
    # An absent weight or bias is never touched (HAS_* compile-time False); x stands in.
    w = weight if weight is not None else x
    b = bias if bias is not None else x
    flags = {"HAS_WEIGHT": weight is not None, "HAS_BIAS": bias is not None, "STORE_STATS": keep_stats}
    if cols <= MAX_FUSED_COLS_FWD:
        block = next_power_of_2(cols)
        launch(_layernorm_fwd_row_kernel, (rows,), x, w, b, y, m, r, rstd_off, cols, eps, **flags, BLOCK=block,
               num_warps=_num_warps(block))
    else:
        launch(_layernorm_fwd_looped_kernel, (rows,), x, w, b, y, m, r, rstd_off, cols, eps, **flags,
               BLOCK=LOOP_BLOCK, num_warps=LOOP_WARPS)
    return y, mean, rstd


def layer_norm_backward(dy: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                        weight: torch.Tensor | None, dx_dtype: torch.dtype, weight_dtype: torch.dtype,
                        bias_dtype: torch.dtype,
                        shared: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx of x's shape as `dx_dtype`, dweight [cols] as `weight_dtype`, dbias [cols] as `bias_dtype`).

    dy and x are contiguous of the same shape, rows along the last dim; mean and rstd are the forward's contiguous
    fp32 statistics, one per row (x.shape[:-1] or flat). dweight and dbias are always computed (a LayerNorm without
    them just discards them). shared: dweight and dbias may be views of one reduction's result (no copy), as in
    layer_norm_forward only for a caller whose results are not an op's outputs.
    """
    _check_rows("dy", dy)
    _check_rows("x", x)
    if dy.shape != x.shape:
        raise ValueError(f"dy {tuple(dy.shape)} and x {tuple(x.shape)} must have the same shape")
    cols = x.shape[-1]
    rows = math.prod(x.shape[:-1])  # not numel // cols: cols may be 0
    _check_param("weight", weight, cols)
    for name, stats in (("mean", mean), ("rstd", rstd)):
        if stats.numel() != rows or stats.dtype != torch.float32 or not stats.is_contiguous():
            raise ValueError(f"{name} must be contiguous fp32 with {rows} values, got {stats.dtype} "
                             f"{tuple(stats.shape)}")
    _check_out_dtype("dx_dtype", dx_dtype)
    return layer_norm_backward_unchecked(dy, x, mean, rstd, weight, dx_dtype, weight_dtype, bias_dtype, shared)


def layer_norm_backward_unchecked(dy: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor | None,
                                  weight: torch.Tensor | None, dx_dtype: torch.dtype, weight_dtype: torch.dtype,
                                  bias_dtype: torch.dtype,
                                  shared: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """layer_norm_backward without its argument checks, for arguments that already passed them: what an eager call's
    own forward saved (op.py's direct path), with the gradient autograd shaped and typed like that forward's output.
    rstd None: mean is layer_norm_forward's packed statistics."""
    cols = x.shape[-1]
    if rstd is None:  # [2, *batch]: the means, then the rstds
        rows = mean.numel() >> 1
        r, rstd_off = mean, rows
    else:
        rows = mean.numel()
        r, rstd_off = rstd, 0
    dx = torch.empty_like(x, dtype=dx_dtype, memory_format=torch.contiguous_format)
    if rows == 0 or cols == 0:
        zeros = torch.zeros((cols,), dtype=torch.float32, device=x.device)
        return dx, zeros.to(weight_dtype), zeros.to(bias_dtype)
    programs = min(rows, _bwd_programs(x.get_device()))
    w = weight if weight is not None else x
    # The partials of dweight and dbias in one [2, P, cols] fp32 buffer, reduced over P by one torch.sum. The row
    # kernel writes every program's row, so it needs no zeroing (two fill launches fewer); the looped kernel
    # accumulates into its rows.
    if cols <= MAX_FUSED_COLS_BWD:
        part = torch.empty((2, programs, cols), dtype=torch.float32, device=x.device)
        block = next_power_of_2(cols)
        launch(_layernorm_bwd_row_kernel, (programs,), dy, x, w, mean, r, rstd_off, dx, part, rows, cols,
               HAS_WEIGHT=weight is not None, BLOCK=block, num_warps=_num_warps(block))
    else:
        part = torch.zeros((2, programs, cols), dtype=torch.float32, device=x.device)
        launch(_layernorm_bwd_looped_kernel, (programs,), dy, x, w, mean, r, rstd_off, dx, part, rows, cols,
               HAS_WEIGHT=weight is not None, BLOCK=LOOP_BLOCK, num_warps=LOOP_WARPS)
    # One reduction on both paths, so the direct call and the op agree bit for bit. .to only where the dtype
    # differs: even a no-op .to is a dispatcher call.
    dweight, dbias = part.sum(dim=1).unbind(0)  # (cols,) each, fp32
    dweight = dweight if weight_dtype == torch.float32 else dweight.to(weight_dtype)
    if bias_dtype != torch.float32:
        dbias = dbias.to(bias_dtype)
    elif not shared and weight_dtype == torch.float32:
        dbias = dbias.clone()  # an op's outputs must not alias each other: a copy in place of a second reduction
    return dx, dweight, dbias


@functools.cache  # per device index (-1: the CPU), so each backward call does not ask CUDA for the SM count
def _bwd_programs(device_index: int) -> int:
    if device_index >= 0:
        return BWD_PROGRAMS_PER_SM * torch.cuda.get_device_properties(device_index).multi_processor_count
    return BWD_PROGRAMS_INTERPRETER  # the interpreter runs programs one after another: few is fastest
