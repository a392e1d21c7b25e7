"""Triton SwiGLU kernels and their launchers, on contiguous tensors of the same shape (walked flat).

Why this exists: Llama's MLP computes act_fn(gate_proj(x)) * up_proj(x) as two eager ops, silu (read gate, write
a temporary) and mul (read the temporary and up, write y), and their backward keeps the temporary alive. These
kernels read gate and up once and write y once, with fp32 math; the backward reads dy, gate and up and writes both
gradients. The two projections stay cuBLAS matmuls: the kernel takes their outputs.

Elementwise over the flattened tensors, BLOCK elements per program. silu(-inf) is NaN (-inf * 0), as in torch.

This module imports triton at import time; import it only when triton is installed (see op.py). Under
TRITON_INTERPRET=1 (set before triton is first imported) the kernels also run on CPU tensors, for tests.
"""


import torch
import triton
import triton.language as tl

from .._launch import launch, cdiv

# 1024 elements over 4 warps: 8 per thread, enough bytes in flight per thread for a streaming kernel.
BLOCK = 1024
NUM_WARPS = 4
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Kernel names start with "_swiglu_fwd" / "_swiglu_bwd": patch.py's kernel_names look for these prefixes in
# profiler traces to prove the kernels ran. Rename both together.


@triton.jit
def _swiglu_fwd_kernel(gate_ptr, up_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # int64 offsets: an MLP activation (tokens * intermediate) can exceed 2**31 elements.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(gate_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = g * tl.sigmoid(g) * u
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(dy_ptr, gate_ptr, up_ptr, dgate_ptr, dup_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    d = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(gate_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(g)
    silu = g * s
    tl.store(dup_ptr + offs, (d * silu).to(dup_ptr.dtype.element_ty), mask=mask)
    # d/dg silu(g) = s * (1 + g * (1 - s)) = s + silu * (1 - s)
    tl.store(dgate_ptr + offs, (d * u * (s + silu * (1.0 - s))).to(dgate_ptr.dtype.element_ty), mask=mask)


def _check(*named: tuple[str, torch.Tensor]) -> None:
    first = named[0][1]
    for name, t in named:
        # Any shape: the kernels walk the memory flat, so a contiguous (B, T, I) activation needs no view.
        if not t.is_contiguous() or t.shape != first.shape:
            raise ValueError(f"{name} must be contiguous of shape {tuple(first.shape)}, got shape {tuple(t.shape)} "
                             f"strides {t.stride()}")
        if t.dtype not in KERNEL_DTYPES:
            raise TypeError(f"{name}: Triton SwiGLU supports {KERNEL_DTYPES}, got {t.dtype}")


def swiglu_forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in fp32, written as promote_types(gate, up); a new tensor, no launch when empty."""
    _check(("gate", gate), ("up", up))
    y = torch.empty_like(gate, dtype=torch.promote_types(gate.dtype, up.dtype))
    n = gate.numel()
    if n:
        launch(_swiglu_fwd_kernel, (cdiv(n, BLOCK),), gate, up, y, n, BLOCK=BLOCK, num_warps=NUM_WARPS)
    return y


def swiglu_backward(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dgate in gate's dtype, dup in up's dtype), fp32 math."""
    _check(("dy", dy), ("gate", gate), ("up", up))
    dgate, dup = torch.empty_like(gate), torch.empty_like(up)
    n = gate.numel()
    if n:
        launch(_swiglu_bwd_kernel, (cdiv(n, BLOCK),), dy, gate, up, dgate, dup, n, BLOCK=BLOCK,
               num_warps=NUM_WARPS)
    return dgate, dup
