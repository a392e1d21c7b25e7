"""Seeded synthetic token batches, identical in every arm's process, and a digest that proves it.

Random token ids are enough for timing and correctness checks: the kernels under test do not branch on token values,
and the same ids go to every arm. Batches stay on the host (pinned when CUDA is present) because copying them to the
device is part of the real loop's cost and is done inside each workload step.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch


def synthetic_token_batches(n: int, batch: int, seq: int, vocab_size: int, seed: int, pin: bool) -> list[torch.Tensor]:
    """Return `n` int64 CPU tensors of shape (batch, seq) with ids uniform in [0, vocab_size).

    Drawn from a private torch.Generator seeded with `seed` (the global RNG is untouched), so the same arguments give
    the same tensors in any process. `pin=True` page-locks them so `.to(device, non_blocking=True)` is a true async
    copy; that needs CUDA, so callers pass `pin=torch.cuda.is_available()`.
    """
    for arg, value in (("n", n), ("batch", batch), ("seq", seq), ("vocab_size", vocab_size)):
        if value < 1:
            raise ValueError(f"{arg} must be >= 1, got {value}")
    if pin and not torch.cuda.is_available():
        raise ValueError("pin=True needs CUDA (pinned host memory); pass pin=torch.cuda.is_available()")

    gen = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, vocab_size, (batch, seq), generator=gen, dtype=torch.int64)  # (B, T)
        out.append(ids.pin_memory() if pin else ids)
    return out


def digest(batches: Iterable[torch.Tensor]) -> str:
    """sha256 hex digest of the batches' dtypes, shapes and values, in order (pinning does not change it)."""
    h = hashlib.sha256()
    for t in batches:
        # Shape and dtype go in too, so (2, 3) and (3, 2) views of the same ids hash differently.
        h.update(f"{t.dtype}|{tuple(t.shape)};".encode())
        h.update(t.detach().to("cpu").contiguous().numpy().tobytes())
    return h.hexdigest()
