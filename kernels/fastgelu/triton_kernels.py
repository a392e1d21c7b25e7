"""Triton GELU kernels (tanh approximation and exact erf) and their launchers, on contiguous tensors (walked flat).

Why this exists: transformers' NewGELUActivation (GPT-2's `gelu_new`) is written as a chain of eager elementwise ops
(pow, mul, add, mul, tanh, add, mul, mul); each one reads and writes the whole MLP activation (B, T, 4 * n_embd),
and autograd saves most of the intermediates for backward. These kernels read x once and write y once (forward),
read dy and x once and write dx once (backward), with fp32 math inside whatever the storage dtype. BERT's exact GELU
(GELUActivation, F.gelu) is already one kernel each way in torch; the erf kernels are the same single pass, so the
gain there is what a tuned launch and dtype handling buy, no more.

Each program handles BLOCK consecutive elements. The tanh formula and its derivative are written as x * sigmoid(2u)
with e = exp(-2|u|), which never overflows and never cancels; the erf ones as x * Phi(x) and Phi(x) + x * phi(x);
cpu.py's docstring derives both.

This module imports triton at import time; import it only when triton is installed (see op.py). Under
TRITON_INTERPRET=1 (set before triton is first imported) the kernels also run on CPU tensors, for tests.
"""

import math

import torch
import triton
import triton.language as tl

from .._launch import launch, cdiv

# Globals used inside @triton.jit must be constexpr.
SQRT_2_OVER_PI = tl.constexpr(math.sqrt(2.0 / math.pi))
CUBIC_COEFF = tl.constexpr(0.044715)
SQRT_HALF = tl.constexpr(math.sqrt(0.5))
INV_SQRT_2PI = tl.constexpr(1.0 / math.sqrt(2.0 * math.pi))

APPROXIMATIONS = ("tanh", "none")  # torch.nn.functional.gelu's names: "none" is the exact erf GELU

# Elements per program: 1024 elements over 4 warps = 8 per thread, enough to keep loads in flight without spilling.
ELEMENTS_PER_PROGRAM = 1024
NUM_WARPS = 4

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Kernel names start with "_gelu_fwd" / "_gelu_bwd" (then "_tanh" or "_erf", so a profile says which GELU ran):
# patch.py's kernel_names look for these prefixes in profiler traces to prove the kernels ran. Rename both together.


@triton.jit
def _gelu_fwd_tanh_kernel(x_ptr, y_ptr, n_elements, BLOCK: tl.constexpr):
    # int64 offsets: a (B, T, 4C) activation can exceed 2**31 elements.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)  # (BLOCK,)
    u = SQRT_2_OVER_PI * (x + CUBIC_COEFF * x * x * x)
    e = tl.exp(-2.0 * tl.abs(u))
    s = tl.where(u >= 0, 1.0, e) / (1.0 + e)  # sigmoid(2u) = 0.5 * (1 + tanh(u))
    tl.store(y_ptr + offs, (x * s).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gelu_bwd_tanh_kernel(dy_ptr, x_ptr, dx_ptr, n_elements, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)  # (BLOCK,)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)  # (BLOCK,)
    u = SQRT_2_OVER_PI * (x + CUBIC_COEFF * x * x * x)
    e = tl.exp(-2.0 * tl.abs(u))
    inv = 1.0 / (1.0 + e)
    s = tl.where(u >= 0, 1.0, e) * inv
    du_dx = SQRT_2_OVER_PI * (1.0 + 3.0 * CUBIC_COEFF * x * x)
    dydx = s + 2.0 * x * (e * inv * inv) * du_dx  # e/(1+e)^2 = s(1-s)
    tl.store(dx_ptr + offs, (dy * dydx).to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gelu_fwd_erf_kernel(x_ptr, y_ptr, n_elements, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)  # (BLOCK,)
    cdf = 0.5 * (1.0 + tl.math.erf(x * SQRT_HALF))  # Phi(x), the formula torch's own gelu uses
    tl.store(y_ptr + offs, (x * cdf).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gelu_bwd_erf_kernel(dy_ptr, x_ptr, dx_ptr, n_elements, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)  # (BLOCK,)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)  # (BLOCK,)
    cdf = 0.5 * (1.0 + tl.math.erf(x * SQRT_HALF))  # Phi(x)
    pdf = INV_SQRT_2PI * tl.exp(-0.5 * x * x)  # phi(x); underflows to 0 for |x| > ~14, never overflows
    tl.store(dx_ptr + offs, (dy * (cdf + x * pdf)).to(dx_ptr.dtype.element_ty), mask=mask)


def _check_1d(name: str, t: torch.Tensor) -> None:
    # Any shape: the kernels walk the memory flat, so a contiguous activation needs no view first.
    if not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous tensor, got shape {tuple(t.shape)} strides {t.stride()}")
    if t.dtype not in KERNEL_DTYPES:
        raise TypeError(f"{name}: Triton GELU supports {KERNEL_DTYPES}, got {t.dtype}")


def _check_out_dtype(name: str, dtype: torch.dtype) -> None:
    if dtype not in KERNEL_DTYPES:
        raise TypeError(f"{name}: Triton GELU writes {KERNEL_DTYPES}, got {dtype}")


def _kernels(approximate: str):
    """(forward, backward) kernels for torch's `approximate` name."""
    if approximate == "tanh":
        return _gelu_fwd_tanh_kernel, _gelu_bwd_tanh_kernel
    if approximate == "none":
        return _gelu_fwd_erf_kernel, _gelu_bwd_erf_kernel
    raise ValueError(f"approximate must be one of {APPROXIMATIONS}, got {approximate!r}")


def gelu_forward(x1d: torch.Tensor, out_dtype: torch.dtype, approximate: str = "tanh") -> torch.Tensor:
    """GELU of a contiguous tensor (any shape), read in its own dtype, fp32 math, written as `out_dtype`.

    approximate: "tanh" (GPT-2's gelu_new) or "none" (exact erf GELU, BERT's), as in torch.nn.functional.gelu.

    Returns a new contiguous tensor; an empty input returns an empty output without a launch.
    """
    _check_1d("x1d", x1d)
    _check_out_dtype("out_dtype", out_dtype)
    fwd_kernel, _ = _kernels(approximate)
    n = x1d.numel()
    y1d = torch.empty_like(x1d, dtype=out_dtype, memory_format=torch.contiguous_format)
    if n == 0:
        return y1d
    grid = (cdiv(n, ELEMENTS_PER_PROGRAM),)
    launch(fwd_kernel, grid, x1d, y1d, n, BLOCK=ELEMENTS_PER_PROGRAM, num_warps=NUM_WARPS)
    return y1d


def gelu_backward(dy1d: torch.Tensor, x1d: torch.Tensor, dx_dtype: torch.dtype, approximate: str = "tanh"
                  ) -> torch.Tensor:
    """dx = dy * GELU'(x) for contiguous tensors of the same shape (dtypes may differ), written as `dx_dtype`."""
    _check_1d("dy1d", dy1d)
    _check_1d("x1d", x1d)
    _check_out_dtype("dx_dtype", dx_dtype)
    _, bwd_kernel = _kernels(approximate)
    if dy1d.shape != x1d.shape:
        raise ValueError(f"dy1d {tuple(dy1d.shape)} and x1d {tuple(x1d.shape)} must have the same shape")
    n = x1d.numel()
    dx1d = torch.empty_like(x1d, dtype=dx_dtype, memory_format=torch.contiguous_format)
    if n == 0:
        return dx1d
    grid = (cdiv(n, ELEMENTS_PER_PROGRAM),)
    launch(bwd_kernel, grid, dy1d, x1d, dx1d, n, BLOCK=ELEMENTS_PER_PROGRAM, num_warps=NUM_WARPS)
    return dx1d
