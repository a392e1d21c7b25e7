"""Tensor comparisons shared by op-level checks and model-level correctness.

The rule (GUIDE section 3): a candidate's output is compared with an fp64 reference by relative-norm error,
and accepted when that error is at most max(factor * the stock path's own error, floor). Relative norms keep
low-magnitude outputs from hiding behind an absolute tolerance; NaN/Inf must sit exactly where the stock
path puts them, and NaN is never "close".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


def reference_facts(reference: torch.Tensor) -> tuple[bool, float]:
    """(all of the reference finite, ||reference||^2 in fp64): what error_norms needs of a reference, computed once
    when several arms are held to the same one."""
    reference = reference.detach().double()
    flat = reference.reshape(-1)
    if bool(torch.isfinite(flat).all()):
        return True, torch.dot(flat, flat).item()
    finite = flat[torch.isfinite(flat)]
    return False, torch.dot(finite, finite).item()


def error_norms(value: torch.Tensor, reference: torch.Tensor,
                facts: tuple[bool, float] | None = None) -> tuple[float, float]:
    """(||value - reference||^2, ||reference||^2) in fp64 over the reference's finite positions.

    Squared norms add up across tensors, so a whole-model figure (all gradients together) needs no
    concatenated copy. A non-finite value where the reference is finite gives an infinite numerator.
    facts: reference_facts(reference), when the caller already has them.
    """
    reference = reference.detach().double()
    all_finite, reference_sq = facts if facts is not None else reference_facts(reference)
    if all_finite:  # the common case: one fp64 difference and one dot product (gradients of 124M parameters)
        diff = torch.sub(value.detach().to(reference.device), reference).reshape(-1)  # promoted to fp64: exact
        error_sq = torch.dot(diff, diff).item()
        # A NaN or Inf in value (the reference is finite) makes the sum NaN or Inf.
        return (error_sq, reference_sq) if math.isfinite(error_sq) else (math.inf, 0.0)
    value = value.detach().to(reference.device, torch.float64)
    finite = torch.isfinite(reference)
    if not bool(torch.isfinite(value[finite]).all()):
        return math.inf, 0.0
    diff = value[finite] - reference[finite]
    return torch.sum(diff * diff).item(), reference_sq


def ratio_of_norms(num_sq: float, denom_sq: float) -> float:
    """sqrt(num_sq / denom_sq), with 0/0 = 0 and x/0 = inf (never NaN: NaN compares False against any tolerance)."""
    if math.isinf(num_sq):
        return math.inf
    if denom_sq == 0:
        return 0.0 if num_sq == 0 else math.inf
    return math.sqrt(num_sq / denom_sq)


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """||value - reference|| / ||reference|| in fp64 over the reference's finite positions.

    A non-finite value where the reference is finite makes the error infinite (never NaN, which would compare
    False against any tolerance and could be mistaken for a pass by careless code).
    """
    return ratio_of_norms(*error_norms(value, reference))


def same_special_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when NaN, +Inf and -Inf occupy exactly the same positions in a and b."""
    a = a.detach()
    b = b.detach().to(a.device)
    return bool(
        torch.equal(torch.isnan(a), torch.isnan(b))
        and torch.equal(torch.isposinf(a), torch.isposinf(b))
        and torch.equal(torch.isneginf(a), torch.isneginf(b))
    )


@dataclass
class Agreement:
    """Outcome of comparing one candidate tensor with the stock output and the fp64 reference."""

    passed: bool
    patched_error: float
    stock_error: float
    tolerance: float
    problems: list[str] = field(default_factory=list)


def compare_to_reference(out, stock: torch.Tensor, reference: torch.Tensor, *, floor: float, factor: float) -> Agreement:
    """Check `out` is a plain tensor like `stock` and as close to `reference` as the stock path is (within factor)."""
    problems: list[str] = []
    if type(out) is not torch.Tensor:
        # Subclasses can be lazy or lie about their contents; the stock op returns a plain tensor.
        return Agreement(False, math.inf, math.nan, floor, [f"output is {type(out).__name__}, not a plain torch.Tensor"])
    if out.dtype != stock.dtype:
        problems.append(f"dtype {str(out.dtype).removeprefix('torch.')} != stock {str(stock.dtype).removeprefix('torch.')}")
    if out.shape != stock.shape:
        return Agreement(False, math.inf, math.nan, floor, [f"shape {tuple(out.shape)} != stock {tuple(stock.shape)}"])
    if out.device != stock.device:
        problems.append(f"device {out.device} != stock {stock.device}")
    if out.stride() != stock.stride():
        problems.append(f"strides {out.stride()} != stock {stock.stride()}")
    if not same_special_values(out, stock):
        problems.append("NaN/Inf positions differ from the stock output")
    patched_sq, reference_sq = error_norms(out, reference)
    stock_sq, _ = error_norms(stock, reference)
    if reference_sq == 0 and math.isfinite(patched_sq) and math.isfinite(stock_sq) and stock_sq > 0:
        # The exact result is zero wherever it is finite (a saturated softmax's gradient, say), so every residue is an
        # infinite relative error, the stock path's too. Hold the kernel to the stock path's own residue instead.
        patched_error, stock_error = math.sqrt(patched_sq), math.sqrt(stock_sq)
        tolerance = factor * stock_error
        if not patched_error <= tolerance:
            problems.append(f"absolute error {patched_error:.3g} > {factor:g} x the stock path's {stock_error:.3g} "
                            "(the exact result is zero)")
        return Agreement(not problems, patched_error, stock_error, tolerance, problems)
    patched_error = ratio_of_norms(patched_sq, reference_sq)
    stock_error = ratio_of_norms(stock_sq, reference_sq)
    tolerance = max(factor * stock_error, floor) if math.isfinite(stock_error) else floor
    if not patched_error <= tolerance:
        problems.append(f"relative error {patched_error:.3g} > tolerance {tolerance:.3g} (stock path: {stock_error:.3g})")
    return Agreement(not problems, patched_error, stock_error, tolerance, problems)
