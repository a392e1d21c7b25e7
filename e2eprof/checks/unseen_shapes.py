"""Inputs of shapes the model never used, for the verified call's unseen-shape check (GUIDE section 3, trick 11).

A kernel can be right only on the shapes its benchmark feeds it: a block size that assumes the row length, a
tail it never masks, a grid that covers exactly the benchmark's rows. The model's own calls cannot show that, since
they are the benchmark's shapes. So the first call of each signature is also run on a few neighbours of its shape,
same rank, each against the stock op and the fp64 reference: a few odd rows, an odd row length (an unmasked tail)
and twice the row length (a block sized for the seen one). The dimensions before the rows (batch, heads) stay as the
model had them, so a kernel that reads them from its module still sees consistent shapes; with a few rows (the
sequence, in a transformer) the neighbours are small, and the check costs little next to the model's own call.

Floating tensors shaped like the first tensor argument get fresh values; other tensors that share a shrinking size
(an attention mask over the rows) are cut to it, so their values keep their meaning; the rest stay. Where the stock
op rejects a neighbour (arguments tied to the shape in other ways, a module whose weights fix the row length), that
shape is not one the kernel owes an answer for, and it is skipped.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

# Rows (the second-to-last dimension) of every neighbour: a few, odd, so a grid sized for the model's row count has
# a partial last program.
NEIGHBOUR_ROWS = 3


def neighbour_shapes(shape: tuple[int, ...], row_length_free: bool) -> list[tuple[int, ...]]:
    """Shapes of the same rank next to SHAPE, smallest first; none for a scalar.

    row_length_free: whether the last dimension may change (False for a module whose weights fix it).
    """
    if len(shape) == 0:
        return []
    length = shape[-1]
    lead = (*shape[:-2], NEIGHBOUR_ROWS) if len(shape) >= 2 else ()
    shapes = [(*lead, length)]
    if row_length_free:
        odd = length + 1 if length % 2 == 0 else length + 2
        shapes += [(*lead, odd), (*lead, 2 * length)]
    return [s for s in dict.fromkeys(shapes) if s != tuple(shape)]


def resized_arguments(args: tuple, kwargs: dict, skip: int, primary: tuple[int, ...], shape: tuple[int, ...],
                      generator: torch.Generator) -> tuple[tuple, dict, list[torch.Tensor]] | None:
    """(args, kwargs, the new tensors) for SHAPE, a neighbour of PRIMARY (the first tensor argument's shape); None
    when the other arguments cannot follow it.

    Every floating tensor shaped like the first tensor argument gets fresh random values of SHAPE (same dtype,
    device). Any other tensor whose dimensions the neighbour shrinks (an attention mask over the rows) is cut to the
    new sizes: its values keep their meaning (the corner of a causal mask is causal), where random values would not.
    A tensor that would have to grow, or a size that both changes and stays in the first argument (rows as long as
    the row length), makes the neighbour unusable. args[:skip] (a bound module) are kept.
    """
    changed = {old: new for old, new in zip(primary, shape) if old != new}
    kept = {old for old, new in zip(primary, shape) if old == new}
    made: list[torch.Tensor] = []

    def resize(value):
        if not isinstance(value, torch.Tensor):
            return value
        if value.is_floating_point() and tuple(value.shape) == primary:
            fresh = torch.randn(shape, generator=generator, dtype=torch.float32).to(device=value.device, dtype=value.dtype)
            made.append(fresh)
            return fresh
        if not changed.keys() & set(value.shape):
            return value
        if any(size in changed and (size in kept or changed[size] > size) for size in value.shape):
            raise _CannotFollow
        return value[tuple(slice(0, changed.get(size, size)) for size in value.shape)]

    try:
        return (*args[:skip], *(resize(a) for a in args[skip:])), {k: resize(v) for k, v in kwargs.items()}, made
    except _CannotFollow:
        return None


class _CannotFollow(Exception):
    """An argument cannot take a neighbour's sizes (see resized_arguments)."""


def neighbours(args: tuple, kwargs: dict, skip: int, row_length_free: bool,
               seed: int = 0) -> Iterator[tuple[tuple[int, ...], tuple, dict, list[torch.Tensor]]]:
    """(shape, args, kwargs, new tensors) per neighbour of the call's first tensor argument; nothing when that
    argument is not a floating tensor (the check is about values a kernel computes)."""
    tensors = [a for a in (*args[skip:], *kwargs.values()) if isinstance(a, torch.Tensor)]
    if not tensors or not tensors[0].is_floating_point():
        return
    primary = tuple(tensors[0].shape)
    generator = torch.Generator().manual_seed(seed)  # CPU draws, then moved: the same values on any device
    for shape in neighbour_shapes(primary, row_length_free):
        resized = resized_arguments(args, kwargs, skip, primary, shape, generator)
        if resized is not None:
            yield (shape, *resized)
