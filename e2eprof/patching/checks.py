"""The anti-cheat helpers of verify mode: how a replacement's call is judged beyond its values.

Each helper looks at one way a kernel can pass a value comparison without being right: memory it never
writes (poisoned allocator), inputs changed in place (bit-identical compare), an output of another kind
(layout findings), results keyed on an address (fresh contents at the same address). The recorder
(`e2eprof.patching.recorder`) runs them on every verified call; `rows.CALL_CHECK_METRICS` names the findings.
Only top-level tensor arguments are inspected (what the replaced functions and forwards take).
"""

from __future__ import annotations

import contextlib
import math

import torch

from e2eprof.checks.tensorcheck import Agreement, compare_to_reference, same_special_values


def tensor_items(value) -> list | None:
    """The elements of a tuple/list output (attention functions return (output, weights)); None for anything else."""
    return list(value) if isinstance(value, (tuple, list)) else None


def to_float64(value):
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().double()
    return value


def tensor_inputs(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """Top-level tensor arguments, positional first, then keyword (the order map_tensors refills them in)."""
    return [a for a in args if isinstance(a, torch.Tensor)] + [v for v in kwargs.values() if isinstance(v, torch.Tensor)]


def map_tensors(args: tuple, skip: int, fn) -> tuple:
    return tuple(a if i < skip or not isinstance(a, torch.Tensor) else fn(a) for i, a in enumerate(args))


def holds_values(value) -> bool:
    """False for a meta tensor (shape and dtype only), or a tuple holding one: there is nothing to compare."""
    items = tensor_items(value)
    if items is not None:
        return all(holds_values(v) for v in items)
    return not (isinstance(value, torch.Tensor) and value.is_meta)


# Findings after which the model cannot go on with the replacement's output (a later op would raise on it).
UNUSABLE = ("output_device", "output_shape")


def identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bits (NaN equal to NaN at the same position)."""
    a, b = a.detach().as_subclass(torch.Tensor), b.detach().as_subclass(torch.Tensor)
    if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
        return False
    if a.is_floating_point() or a.is_complex():
        nan = torch.isnan(a)
        return bool(torch.equal(nan, torch.isnan(b)) and torch.equal(a[~nan], b[~nan]))
    return bool(torch.equal(a, b))


def _poison_allocator(inputs: list[torch.Tensor]) -> None:
    """Fill soon-to-be-reused memory with NaN, so an output that is never written cannot hold an earlier result.

    An output-sized NaN block is allocated and freed right before the call: CUDA's caching allocator hands that
    block to the next allocation of the size (a kernel's torch.empty_like output), and CPU malloc usually does.
    Outputs are guessed to be input-sized, in the input dtype or fp32 (autocast's upcast).
    """
    for t in inputs:
        if t.is_floating_point() and t.numel():
            for dtype in {t.dtype, torch.float32}:
                torch.full(t.shape, math.nan, dtype=dtype, device=t.device)


@contextlib.contextmanager
def unwritten_is_nan(inputs: list[torch.Tensor]):
    """Around a checked call: memory it allocates and never writes holds NaN, not an earlier result.

    The allocator is poisoned first (_poison_allocator), which rests on the next allocation reusing the freed NaN
    block: CUDA's caching allocator does that. CPU malloc mostly does not (a gpt2-tiny softmax output got a different
    address in 2000 of 2000 tries), so on the CPU torch also fills torch.empty* with NaN (integers: their maximum)
    while deterministic algorithms are on (torch.utils.deterministic.fill_uninitialized_memory); warn_only, so an op
    without a deterministic implementation still runs. That fill only around the checked call, and only on the CPU:
    GPU behaviour stays what the H200 tests exercised.
    """
    _poison_allocator(inputs)
    if not any(t.device.type == "cpu" for t in inputs):
        yield
        return
    enabled, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = fill
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def writable(t: torch.Tensor) -> bool:
    # An expanded tensor (stride 0 over a dimension longer than 1) has elements sharing memory: no copy_ into it.
    return all(stride != 0 or size == 1 for stride, size in zip(t.stride(), t.shape))


def fresh_contents(t: torch.Tensor) -> torch.Tensor:
    """Different values of the same kind: reversed in every dimension and scaled (keeps masks' huge negatives)."""
    return (t.flip(list(range(t.dim()))) if t.dim() else t) * 0.75


def layout_findings(out, stock) -> dict[str, str]:
    """Metric -> detail for each way `out` differs from the stock output in kind rather than in value."""
    items = tensor_items(stock)
    if items is not None:
        outs = tensor_items(out)
        if outs is None or len(outs) != len(items):
            return {"output_shape": f"{type(out).__name__} instead of a {len(items)}-tuple like the stock function"}
        found: dict[str, str] = {}
        for i, (o, s) in enumerate(zip(outs, items)):
            for metric, detail in layout_findings(o, s).items():
                found.setdefault(metric, f"output[{i}]: {detail}")
        return found
    if not isinstance(stock, torch.Tensor):
        return {}
    if type(out) is not torch.Tensor:
        found = {"output_not_plain_tensor": f"returned {type(out).__module__}.{type(out).__name__}"}
        if not isinstance(out, torch.Tensor):
            return found
        out = out.as_subclass(torch.Tensor)  # judge what it holds, not what its methods claim
    else:
        found = {}
    name = lambda dtype: str(dtype).removeprefix("torch.")  # noqa: E731
    if out.dtype != stock.dtype:
        found["output_dtype"] = f"{name(out.dtype)} != stock {name(stock.dtype)}"
    if out.shape != stock.shape:
        found["output_shape"] = f"{tuple(out.shape)} != stock {tuple(stock.shape)}"
        return found
    if out.device != stock.device:
        found["output_device"] = f"{out.device} != stock {stock.device}"
        if out.is_meta:
            return found  # no values to look at
    elif out.stride() != stock.stride():
        found["output_strides"] = f"{out.stride()} != stock {stock.stride()}"
    if not same_special_values(out, stock):
        found["nan_inf_positions"] = "NaN/Inf positions differ from the stock output"
    return found


def other_device_agreement(out: torch.Tensor, stock: torch.Tensor, reference, floor: float, factor: float) -> Agreement:
    """A failed agreement for an output on another device, with its values judged on the stock output's device.

    Comparing across devices would raise (and a crash would hide the finding); a meta output has no values at all.
    """
    where = f"device {out.device} != stock {stock.device}"
    if out.is_meta:
        return Agreement(False, math.inf, math.nan, floor, [f"{where}: the output holds no values"])
    result = compare_to_reference(out.to(stock.device), stock, reference, floor=floor, factor=factor)
    return Agreement(False, result.patched_error, result.stock_error, result.tolerance, [where, *result.problems])
