"""Argument signatures of recorded calls: a cheap hashable key per call, formatted only when reported.

A signature is what distinguishes one call of a replaced op from another (shapes, dtypes, plain values),
so calls are counted and verified per signature.
"""

from __future__ import annotations

import torch


def signature_key(args: tuple, kwargs: dict) -> tuple:
    """Cheap hashable key of the shapes/dtypes/values a call received (formatted only when reported).

    This runs on every call of the patched function, inside the timed loop, so it must cost far less than a
    kernel launch: tuples of shapes and dtypes, no string formatting.
    """
    key = tuple((a.dtype, tuple(a.shape)) if isinstance(a, torch.Tensor)
                else _ModuleArg(type(a).__name__) if isinstance(a, torch.nn.Module) else a for a in args)
    if kwargs:
        key += tuple((k, (v.dtype, tuple(v.shape)) if isinstance(v, torch.Tensor) else v) for k, v in sorted(kwargs.items()))
    return key


class _ModuleArg(str):
    """A module argument in a signature key: its class name, so every layer's call shares one signature."""

    def __repr__(self) -> str:
        return str(self)


def format_signature(key: tuple) -> str:
    """'float32[8,12,1024,1024], dim=-1' for a key made by signature_key."""

    def one(value) -> str:
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], torch.dtype):
            return f"{str(value[0]).removeprefix('torch.')}[{','.join(map(str, value[1]))}]"
        if isinstance(value, torch.dtype):
            return str(value).removeprefix("torch.")
        return repr(value)

    parts = []
    for item in key:
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            parts.append(f"{item[0]}={one(item[1])}")
        else:
            parts.append(one(item))
    return ", ".join(parts)
