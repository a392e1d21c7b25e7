"""Correctness of one implementation on fresh random inputs, before any timing.

The candidate runs first with every fresh allocation poisoned (NaN), is compared with the patch's fp64 reference under
the patch's rule (relative-norm error at most max(error_factor * stock error, floor); NaN/Inf where the stock output
has them; dtype, shape and strides of the stock output), gradients too for forward+backward, then runs again after
the stock op and the reference and must return the same bits (uninitialised memory that happens to hold a freed
correct answer fails one way or the other).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.utils.deterministic

from e2eprof.microbench.op_calls import (Inputs, Op, backward, draw_inputs, forward, fresh_grad_outputs,
                                         poisoned_allocations, tensors_of)
from e2eprof.microbench.capture import CallSpec, TensorSpec, dtype_name
from e2eprof.patch import Patch
from e2eprof.checks.tensorcheck import compare_to_reference


@dataclass
class Check:
    passed: bool
    error: float  # worst relative-norm error against the fp64 reference (outputs, and gradients when checked)
    tolerance: float  # the tolerance of that worst entry
    stock_error: float
    problems: list[str] = field(default_factory=list)


def _float64_inputs(inputs: Inputs, grad: bool) -> tuple[tuple, dict, list[torch.Tensor]]:
    """The same values in float64 for the reference, differentiable where the originals are grad targets."""
    wanted = {id(t) for t in inputs.grad_targets}
    targets: list[torch.Tensor] = []

    def convert(value):
        if not (isinstance(value, torch.Tensor) and value.is_floating_point()):
            return value
        t = value.detach().double()
        if grad and id(value) in wanted:
            targets.append(t.requires_grad_(True))
        return t

    args = tuple(convert(a) for a in inputs.args)
    kwargs = {k: convert(v) for k, v in inputs.kwargs.items()}
    # Module parameters stay as they are: the reference reads them from the module and casts them itself.
    targets += [t for t in inputs.grad_targets if not any(t is a for a in (*inputs.args, *inputs.kwargs.values()))]
    return args, kwargs, targets


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.detach().reshape(-1).view(torch.uint8), b.detach().reshape(-1).view(torch.uint8))


def check(candidate: Callable, op: Op, patch: Patch, spec: CallSpec, outs: Sequence[TensorSpec], grad: bool) -> Check:
    """Run `candidate` on fresh inputs and judge it against the stock op and the fp64 reference (see module doc).

    grad: also run backward with a fresh grad_output and check every gradient the stock op produces.
    """
    inputs = draw_inputs(spec)
    grad_outs = fresh_grad_outputs(outs, spec.device) if grad else []
    forward_grad = grad or spec.grad_enabled
    try:
        with poisoned_allocations():
            got = forward(candidate, spec, inputs, forward_grad)
            got_grads = backward(got, inputs, grad_outs) if grad else ()
    except Exception as exc:  # a candidate that raises on a shape the model feeds it is wrong on that shape
        return Check(False, math.inf, math.nan, math.nan, [f"raised {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"])
    stock = forward(op.eager, spec, inputs, forward_grad)
    stock_grads = backward(stock, inputs, grad_outs) if grad else ()
    if op.reference is not None:
        args64, kwargs64, targets64 = _float64_inputs(inputs, grad)
        with torch.autocast(torch.device(spec.device).type, enabled=False), torch.set_grad_enabled(grad):
            ref = op.reference(*args64, **kwargs64)
        ref_outs = [o for o in tensors_of(ref) if o.requires_grad]
        ref_grads = torch.autograd.grad(ref_outs, targets64, [g.double() for g in grad_outs][: len(ref_outs)],
                                        allow_unused=True) if grad else ()
    else:  # no fp64 reference declared: the stock output in fp64 is the yardstick (stock error 0, floor applies)
        ref = [t.detach().double() for t in tensors_of(stock)]
        ref_grads = [None if g is None else g.double() for g in stock_grads]
    pairs = [(g, s, r, "output") for g, s, r in zip(tensors_of(got), tensors_of(stock), tensors_of(ref))]
    pairs += [(g, s, r, "grad") for g, s, r in zip(got_grads, stock_grads, ref_grads) if s is not None and r is not None]
    result = Check(True, 0.0, math.nan, 0.0)
    if len(tensors_of(got)) != len(tensors_of(stock)):
        result.passed = False
        result.problems.append(f"{len(tensors_of(got))} output tensors, stock returns {len(tensors_of(stock))}")
    worst = -1.0
    for value, stock_value, reference, what in pairs:
        if value is None:
            result.passed = False
            result.problems.append(f"{what}: no gradient where the stock op has one")
            continue
        floor = patch.tolerance_for(dtype_name(stock_value.dtype))
        agreement = compare_to_reference(value, stock_value, reference, floor=floor, factor=patch.error_factor)
        result.stock_error = max(result.stock_error, agreement.stock_error)
        ratio = agreement.patched_error / agreement.tolerance if agreement.tolerance > 0 else math.inf
        if ratio > worst:
            worst, result.error, result.tolerance = ratio, agreement.patched_error, agreement.tolerance
        if not agreement.passed:
            result.passed = False
            result.problems += [f"{what}: {p}" for p in agreement.problems]
    del stock, stock_grads, ref, ref_grads  # freed: a lazy candidate's next buffers may now hold these answers
    with poisoned_allocations():
        again = forward(candidate, spec, inputs, forward_grad)
        again_grads = backward(again, inputs, grad_outs) if grad else ()
    repeat = [(a, b) for a, b in zip(tensors_of(got) + list(got_grads), tensors_of(again) + list(again_grads))
              if a is not None and b is not None]
    if not all(_same_bits(a, b) for a, b in repeat):
        result.passed = False
        result.problems.append("a second call on the same inputs returned different bits (uninitialised or racy memory?)")
    return result
