"""What the kernels' real CPU implementations share: the dtype their math runs in, and chunking that bounds memory.

The CPU implementations compute in fp32 (fp64 when an operand is fp64, so gradcheck works) and walk their input in
chunks, so one chunk's fp32 temporaries stay around 4 MiB (cache-sized) however large the tensor.
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 1 << 20


def compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """fp64 when any operand is fp64, else fp32 (None operands, such as an absent mask or bias, are skipped)."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def row_chunks(rows: int, cols: int):
    """Slices of whole rows holding about CHUNK_ELEMENTS elements each (at least one row)."""
    step = max(1, CHUNK_ELEMENTS // max(cols, 1))
    for start in range(0, rows, step):
        yield slice(start, min(start + step, rows))


def chunks(n: int):
    """Slices of a flat tensor of n elements, CHUNK_ELEMENTS at a time."""
    for start in range(0, n, CHUNK_ELEMENTS):
        yield slice(start, min(start + CHUNK_ELEMENTS, n))
