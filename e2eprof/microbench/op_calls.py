"""The callables of one captured call (replacement, stock and fp64 reference) and how the microbenchmark calls them:
fresh random inputs shaped and strided like the model's, forward and backward as a training step runs them, and
allocations poisoned with NaN for the correctness check.
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.utils.deterministic  # noqa: F401  (poisoned_allocations sets its flag; not imported by torch itself everywhere)

from e2eprof.microbench.capture import CallSpec, TensorSpec
from e2eprof.patch import Patch
from e2eprof.patching import CallRecorder


@dataclass
class Op:
    """replacement, eager (stock) and reference, each taking the spec's arguments in call order."""

    replacement: Callable
    eager: Callable
    reference: Callable | None


def stock_callable(patch: Patch, target: str):
    """The stock object at `target` (function or class), resolved as the modeling module sees it."""
    module_name, _, path = target.partition(":")
    obj = importlib.import_module(module_name)
    for part in path.split("."):
        obj = getattr(obj, part)
    if isinstance(obj, CallRecorder) or obj is patch.replacement:
        # The microbenchmark must see the stock op; a patch left applied would benchmark itself against itself.
        raise RuntimeError(f"patch '{patch.name}' is still applied at {target}; revert it before microbenchmarking")
    return obj


def op_for(patch: Patch, spec: CallSpec) -> Op:
    stock = stock_callable(patch, spec.target)
    if spec.kind != "class":
        return Op(patch.replacement, stock, patch.reference)
    module, new_forward, old_forward, reference = spec.module, patch.replacement.forward, stock.forward, patch.reference
    return Op(lambda *a, **k: new_forward(module, *a, **k), lambda *a, **k: old_forward(module, *a, **k),
              None if reference is None else (lambda *a, **k: reference(module, *a, **k)))


@dataclass
class Inputs:
    args: tuple
    kwargs: dict
    grad_targets: list[torch.Tensor]  # inputs and module parameters a backward pass differentiates


def _draw(spec: TensorSpec, device: torch.device) -> torch.Tensor:
    if spec.dtype.is_floating_point:
        draw_dtype = spec.dtype if spec.dtype in (torch.float32, torch.float64) else torch.float32
        value = torch.randn(spec.shape, device=device, dtype=draw_dtype).to(spec.dtype)
    elif spec.dtype == torch.bool:
        value = torch.rand(spec.shape, device=device) > 0.5
    else:
        value = torch.randint(0, 8, spec.shape, device=device, dtype=spec.dtype)
    if spec.contiguous:
        return value
    # Same strides as the model's tensor: a kernel that assumes contiguity must meet the real layout.
    strided = torch.empty_strided(spec.shape, spec.stride, dtype=spec.dtype, device=device)
    return strided.copy_(value)


def draw_inputs(spec: CallSpec) -> Inputs:
    """Fresh random arguments shaped like the spec's (new contents every time, never a cached buffer).

    Under the model's grad mode, tensors that required grad there require it here, so even a forward-only pass
    pays what the training forward pays (saving tensors for backward).
    """
    device = torch.device(spec.device)
    grad = spec.grad_enabled
    targets: list[torch.Tensor] = []

    def make(value):
        if not isinstance(value, TensorSpec):
            return value
        t = _draw(value, device)
        if grad and value.requires_grad and t.is_floating_point():
            targets.append(t.requires_grad_(True))
        return t

    args = tuple(make(a) for a in spec.args)
    kwargs = {k: make(v) for k, v in spec.kwargs.items()}
    if grad and spec.module is not None:
        targets += [p for p in spec.module.parameters() if p.requires_grad]
    return Inputs(args, kwargs, targets)


def tensors_of(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, list | tuple):
        return [o for o in out if isinstance(o, torch.Tensor)]
    return []


def forward(fn: Callable, spec: CallSpec, inputs: Inputs, grad: bool):
    with torch.set_grad_enabled(grad), spec.context():
        return fn(*inputs.args, **inputs.kwargs)


def backward(out, inputs: Inputs, grad_outs: Sequence[torch.Tensor]) -> tuple:
    """Gradients of the differentiable outputs w.r.t. the grad targets, outside autocast (as a training loop does)."""
    outs = [o for o in tensors_of(out) if o.requires_grad]
    return torch.autograd.grad(outs, inputs.grad_targets, list(grad_outs)[: len(outs)], allow_unused=True)


def fresh_grad_outputs(outs: Sequence[TensorSpec], device: str) -> list[torch.Tensor]:
    return [torch.randn(o.shape, device=device, dtype=torch.float32).to(o.dtype) for o in outs if o.dtype.is_floating_point]


@contextlib.contextmanager
def poisoned_allocations():
    """Inside, torch.empty & co. return NaN-filled memory (max int for integers), on CPU and CUDA alike.

    Uses torch's deterministic mode, whose fill_uninitialized_memory does exactly this; warn_only so ops without a
    deterministic implementation still run (this is a correctness check, not a timing).
    """
    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    was_fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = was_fill
        torch.use_deterministic_algorithms(was_on, warn_only=was_warn_only)
