"""The one engine that applies, counts, verifies and reverts any declared `Patch`.

Applying resolves every target before touching anything (all-or-nothing), installs a `CallRecorder` that
counts calls and records argument signatures, and returns an `AppliedPatch` that reverts exactly what it
changed. In verify mode the recorder also runs the stock function and the fp64 reference on the same
arguments and records how far the patched output is from each (`OpCheck` rows), and runs the anti-cheat
checks on every call (CALL_CHECK_METRICS: poisoned allocator, inputs compared before/after, output kind,
a repeat on copies, new contents at the same address, threads left running).

A class target swaps each instance's class for the replacement subclass and binds one recorder per target as
each instance's `forward`, so module replacements are counted and verified too: the recorder calls
replacement.forward(module, x), the stock forward(module, x) and reference(module, x in float64).
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
import math
import pkgutil
import threading
import time
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from e2eprof import stress
from e2eprof.errors import PatchError
from e2eprof.patch import Patch
from e2eprof.tensorcheck import Agreement, compare_to_reference, same_special_values
from e2eprof.unseen_shapes import neighbours


class ModuleProxy(types.ModuleType):
    """Stands in for a shared module (e.g. torch.nn) inside one modeling module's namespace.

    Attributes listed in `overrides` are served from there; everything else from the real module, so the
    modeling code keeps working and the rest of the process never sees the replacement.
    """

    def __init__(self, wrapped: types.ModuleType, overrides: dict):
        super().__init__(wrapped.__name__, wrapped.__doc__)
        self.__dict__["_e2eprof_wrapped"] = wrapped
        self.__dict__.update(overrides)

    def __getattr__(self, name: str):
        return getattr(self.__dict__["_e2eprof_wrapped"], name)


def _signature_key(args: tuple, kwargs: dict) -> tuple:
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


def _tensor_items(value) -> list | None:
    """The elements of a tuple/list output (attention functions return (output, weights)); None for anything else."""
    return list(value) if isinstance(value, (tuple, list)) else None


def format_signature(key: tuple) -> str:
    """'float32[8,12,1024,1024], dim=-1' for a key made by _signature_key."""

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


def _to_float64(value):
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().double()
    return value


# ---- Anti-cheat checks of verify mode (GUIDE section 3; README "What e2eprof checks") ----------------------
# Each is its own correctness row, so a report names the trick, not just "incorrect". Only top-level tensor
# arguments are inspected (what the replaced functions and forwards take).
CALL_CHECK_METRICS = {
    "output_not_plain_tensor": "a tensor subclass (possibly lazy, or lying about its contents) instead of torch.Tensor",
    "output_dtype": "an output dtype other than the stock op's (a quiet precision change)",
    "output_shape": "an output shape other than the stock op's",
    "output_strides": "output strides other than the stock op's (later ops may read it wrongly)",
    "output_device": "an output on another device than the stock op's",
    "nan_inf_positions": "NaN/Inf where the stock output has finite values, or the reverse",
    "input_mutated": "inputs changed in place (compared bit for bit before and after the call)",
    "nondeterministic": "a second call on copies of the inputs (new address, same contents) not bit-identical",
    "stale_output": "the same tensors refilled with new contents give an output that does not follow them (caching)",
    "threads_leaked": "Python threads started by the call still running when it returns (work off the clock)",
    "unseen_shape": "wrong results, or a raise, on neighbouring shapes the model did not use (e2eprof.unseen_shapes)",
    "stress": "wrong results, forward or backward, on inputs across the range the op can meet (e2eprof.stress)",
}


def _tensor_inputs(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """Top-level tensor arguments, positional first, then keyword (the order _map_tensors refills them in)."""
    return [a for a in args if isinstance(a, torch.Tensor)] + [v for v in kwargs.values() if isinstance(v, torch.Tensor)]


def _map_tensors(args: tuple, skip: int, fn) -> tuple:
    return tuple(a if i < skip or not isinstance(a, torch.Tensor) else fn(a) for i, a in enumerate(args))


def _holds_values(value) -> bool:
    """False for a meta tensor (shape and dtype only), or a tuple holding one: there is nothing to compare."""
    items = _tensor_items(value)
    if items is not None:
        return all(_holds_values(v) for v in items)
    return not (isinstance(value, torch.Tensor) and value.is_meta)


# Findings after which the model cannot go on with the replacement's output (a later op would raise on it).
UNUSABLE = ("output_device", "output_shape")


def _identical(a: torch.Tensor, b: torch.Tensor) -> bool:
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
def _unwritten_is_nan(inputs: list[torch.Tensor]):
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


def _writable(t: torch.Tensor) -> bool:
    # An expanded tensor (stride 0 over a dimension longer than 1) has elements sharing memory: no copy_ into it.
    return all(stride != 0 or size == 1 for stride, size in zip(t.stride(), t.shape))


def _fresh_contents(t: torch.Tensor) -> torch.Tensor:
    """Different values of the same kind: reversed in every dimension and scaled (keeps masks' huge negatives)."""
    return (t.flip(list(range(t.dim()))) if t.dim() else t) * 0.75


def _layout_findings(out, stock) -> dict[str, str]:
    """Metric -> detail for each way `out` differs from the stock output in kind rather than in value."""
    items = _tensor_items(stock)
    if items is not None:
        outs = _tensor_items(out)
        if outs is None or len(outs) != len(items):
            return {"output_shape": f"{type(out).__name__} instead of a {len(items)}-tuple like the stock function"}
        found: dict[str, str] = {}
        for i, (o, s) in enumerate(zip(outs, items)):
            for metric, detail in _layout_findings(o, s).items():
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


def call_check_rows(workload: str, arm: str, checks: list[dict]) -> list[dict]:
    """One correctness row per anti-cheat metric over all checked calls (value: calls that failed it)."""
    rows = []
    calls = sum(c["calls"] for c in checks)
    for metric, guards in CALL_CHECK_METRICS.items():
        failed = [(c["signature"], *c.get("findings", {})[metric]) for c in checks if metric in c.get("findings", {})]
        count = sum(n for _, n, _ in failed)
        detail = f"{failed[0][0]}: {failed[0][2]}" if failed else f"{calls} calls checked: no {guards}"
        if metric == "unseen_shape" and not failed:  # say what was tried: a stock op that rejects every
            tried = sum(c.get("unseen_shapes", 0) for c in checks)  # neighbour leaves nothing checked
            detail = (f"{tried} neighbouring shapes of {len(checks)} call signatures checked: none wrong" if tried else
                      "no neighbouring shape checked: the other arguments could not follow one, or the stock op took none")
        if metric == "stress" and not failed:
            tried = sum(c.get("stress_points", 0) for c in checks)
            kinds = sorted({kind for c in checks for kind in c.get("stress_kinds", [])})
            seconds = sum(c.get("stress_s", 0.0) for c in checks)
            detail = (f"{tried} stress points of {len(checks)} call signatures checked ({', '.join(kinds)}) in "
                      f"{seconds:.2f} s: none wrong"
                      if tried else "no stress point checked: the patch declares none, or the stock op took none")
        rows.append({"workload": workload, "arm": arm, "tensor": failed[0][0] if failed else "-", "metric": metric,
                     "value": float(count), "tolerance": 0.0, "passed": not failed, "detail": detail})
    return rows


@dataclass
class OpCheck:
    """Worst errors seen for one argument signature while verifying.

    passed/problems are the value comparison (against the stock output and the fp64 reference); `findings`
    holds the anti-cheat checks (see CALL_CHECK_METRICS): metric -> [calls that failed it, first detail].
    """

    signature: str
    calls: int = 0
    passed: bool = True
    patched_error: float = 0.0
    stock_error: float = 0.0
    tolerance: float = 0.0
    problems: list[str] = field(default_factory=list)
    findings: dict[str, list] = field(default_factory=dict)
    unseen_shapes: int = 0  # neighbouring shapes checked (the stock op took them), wrong or not
    stress_points: int = 0  # stress points checked (e2eprof.stress), forward and backward each counted once
    stress_kinds: list[str] = field(default_factory=list)
    stress_s: float = 0.0  # seconds the stress points took: what the check adds to the gate

    def add_finding(self, metric: str, detail: str) -> None:
        entry = self.findings.setdefault(metric, [0, detail])
        entry[0] += 1


REPLACED_RANGE_PREFIX = "e2eprof.replaced::"


class CallRecorder:
    """The callable installed at a target: counts calls, records signatures, optionally verifies."""

    def __init__(self, patch: Patch, original: Callable, passthrough: bool = False, target: Callable | None = None,
                 method: bool = False):
        self.patch = patch
        self.original = original
        # passthrough: call the stock function (used in stock arms while profiling, so the replaced region is
        # measured the same way in every arm).
        self.target = original if passthrough else (patch.replacement if target is None else target)
        # method: called as forward(module, *args) for a class target; the module is left out of signatures and
        # passed first to the stock forward and to the reference (which reads the module's weights).
        self.skip = 1 if method else 0
        self.range_name = f"{REPLACED_RANGE_PREFIX}{patch.name}"
        self.mark_ranges = False
        self.calls = 0
        self.signatures: Counter[tuple] = Counter()
        self.verify = False
        self.extended = True  # verify also runs the once-per-signature unseen-shape and stress checks
        self.checks: dict[str, OpCheck] = {}

    def __call__(self, *args, **kwargs):
        self.calls += 1
        key = _signature_key(args[self.skip:], kwargs)
        self.signatures[key] += 1
        if self.verify:
            return self._verified_call(format_signature(key), args, kwargs)
        if self.mark_ranges:
            with torch.profiler.record_function(self.range_name):
                return self.target(*args, **kwargs)
        return self.target(*args, **kwargs)

    def _verified_call(self, signature: str, args: tuple, kwargs: dict):
        """The model's call, plus every per-call check of verify mode (see "Anti-cheat checks" below)."""
        check = self.checks.setdefault(signature, OpCheck(signature))
        check.calls += 1
        inputs = _tensor_inputs(args[self.skip:], kwargs)
        before = [t.detach().clone() for t in inputs]
        threads = threading.active_count()
        with _unwritten_is_nan(inputs):
            out = self.target(*args, **kwargs)
        started = threading.active_count() - threads
        if started > 0:
            check.add_finding("threads_leaked", f"{started} Python thread(s) still running after the call returned")
        mutated = [i for i, (t, b) in enumerate(zip(inputs, before)) if not _identical(t, b)]
        if mutated and not self._stock_mutates(args, kwargs, before):
            check.add_finding("input_mutated", f"tensor argument(s) {mutated} changed by the call")
        with torch.no_grad():
            stock, reference = self._expected(args, kwargs)
            self._compare(check, out, stock, reference)
            findings = _layout_findings(out, stock)
            for metric, detail in findings.items():
                check.add_finding(metric, detail)
            self._check_repeatable(check, args, kwargs, out, before)
            self._check_fresh_contents(check, args, kwargs, inputs, [b if i not in mutated else None
                                                                      for i, b in enumerate(before)])
            if check.calls == 1 and self.extended:  # once per signature: a shape's neighbours and ranges stay put
                self._check_unseen_shapes(check, args, kwargs)
                self._check_stress(check, args, kwargs)
            elif check.calls == 1:
                self._check_backward(check, args, kwargs)
        if any(metric in findings for metric in UNUSABLE):
            # The model's next op would raise on this output (another device, another shape), and the arm would
            # then fail as a crash, losing the precise finding just recorded. Hand the model the stock output
            # instead, so the capture finishes and the report names the check. Recomputed outside no_grad: a
            # train capture backpropagates through it. This changes nothing in the verdict: the finding fails it.
            return self.original(*args, **kwargs)
        return out

    def _expected(self, args: tuple, kwargs: dict):
        """(stock output, fp64 reference) for these arguments."""
        stock = self.original(*args, **kwargs)  # under the caller's autocast state: exact stock semantics
        if self.patch.reference is not None:
            device_type = stock.device.type if isinstance(stock, torch.Tensor) else "cpu"
            with torch.autocast(device_type, enabled=False):
                reference = self.patch.reference(*[_to_float64(a) for a in args], **{k: _to_float64(v) for k, v in kwargs.items()})
        else:
            reference = stock.double() if isinstance(stock, torch.Tensor) else stock
        return stock, reference

    def _agreement(self, out, stock, reference):
        items = _tensor_items(stock)
        if items is not None:
            return self._tuple_agreement(out, items, _tensor_items(reference))
        floor = self.patch.tolerance_for(str(getattr(stock, "dtype", "")).removeprefix("torch."))
        if type(out) is torch.Tensor and isinstance(stock, torch.Tensor) and out.device != stock.device:
            return _other_device_agreement(out, stock, reference, floor, self.patch.error_factor)
        return compare_to_reference(out, stock, reference, floor=floor, factor=self.patch.error_factor)

    def _tuple_agreement(self, out, stock: list, reference: list | None) -> Agreement:
        """Every tensor element of a tuple output judged on its own; the worst one decides."""
        outs = _tensor_items(out)
        if outs is None or reference is None or len(outs) != len(stock) or len(reference) != len(stock):
            return Agreement(False, math.inf, math.nan, 0.0,
                             [f"output is {type(out).__name__}, the stock function returns a {len(stock)}-tuple"])
        parts = [(i, self._agreement(o, s, r)) for i, (o, s, r) in enumerate(zip(outs, stock, reference))
                 if isinstance(s, torch.Tensor)]
        return Agreement(all(a.passed for _, a in parts), max(a.patched_error for _, a in parts),
                         max(a.stock_error for _, a in parts), max(a.tolerance for _, a in parts),
                         [f"output[{i}]: {p}" for i, a in parts for p in a.problems])

    def _stock_mutates(self, args: tuple, kwargs: dict, before: list[torch.Tensor]) -> bool:
        """Does the stock function change its inputs too (an in-place op)? Then so may the replacement."""
        copies = [b.clone() for b in before]
        feed = iter(copies)
        with torch.no_grad():
            self.original(*_map_tensors(args, self.skip, lambda _: next(feed)),
                          **{k: next(feed) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})
        return any(not _identical(c, b) for c, b in zip(copies, before))

    def _check_repeatable(self, check: OpCheck, args: tuple, kwargs: dict, out, before: list[torch.Tensor]) -> None:
        """Run again on copies of the original inputs (new address, same contents): the output must be bit-identical.

        Catches kernels that read uninitialised or out-of-bounds memory, race, or key results on an address.
        """
        outs = _tensor_items(out) or [out]  # a tuple output (attention) is compared element by element
        if not any(isinstance(o, torch.Tensor) for o in outs) or not _holds_values(out):
            return  # a meta output has no bits to repeat (output_device already failed it)
        copies = iter([b.clone() for b in before])
        again = self.target(*_map_tensors(args, self.skip, lambda _: next(copies)),
                            **{k: next(copies) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})
        agains = _tensor_items(again) or [again]
        same = len(agains) == len(outs) and all(
            isinstance(a, torch.Tensor) and _identical(a, o) for a, o in zip(agains, outs) if isinstance(o, torch.Tensor))
        if not same:
            check.add_finding("nondeterministic", "a second call on copies of the same inputs gave a different output")

    def _check_fresh_contents(self, check: OpCheck, args: tuple, kwargs: dict, inputs: list[torch.Tensor],
                              restore: list[torch.Tensor | None]) -> None:
        """Same tensors (same addresses), new contents: the output must follow the new contents.

        Catches results cached by pointer or object id. The model's tensors get their contents back afterwards
        (what the call left in them, so a mutating kernel is not silently repaired).
        """
        floating = [i for i, t in enumerate(inputs) if t.is_floating_point() and t.numel() > 1 and _writable(t)]
        if not floating:
            return
        saved = {i: restore[i] if restore[i] is not None else inputs[i].detach().clone() for i in floating}
        try:
            for i in floating:
                inputs[i].data.copy_(_fresh_contents(saved[i]))
            out = self.target(*args, **kwargs)
            stock, reference = self._expected(args, kwargs)
            result = self._agreement(out, stock, reference)
            if not result.passed:
                check.add_finding("stale_output", "with new contents at the same address: " + "; ".join(result.problems))
        finally:
            for i in floating:
                inputs[i].data.copy_(saved[i])

    def _row_length_free(self, args: tuple) -> bool:
        """Whether the op takes rows of any length: a function, or a module without weights to fix the length."""
        module = args[0] if self.skip else None
        return module is None or not any(True for _ in module.parameters())

    def _check_unseen_shapes(self, check: OpCheck, args: tuple, kwargs: dict) -> None:
        """The same call on neighbouring shapes the model never used (e2eprof.unseen_shapes), each judged against
        the stock op and the fp64 reference like the model's own call. A kernel right only on the benchmark's
        shapes fails here; a neighbour the stock op rejects is not owed an answer and is skipped."""
        for shape, new_args, new_kwargs, fresh in neighbours(args, kwargs, self.skip, self._row_length_free(args)):
            try:
                stock, reference = self._expected(new_args, new_kwargs)
            except Exception:  # noqa: BLE001 - the stock op does not take this shape
                continue
            check.unseen_shapes += 1
            where = f"shape {list(shape)}"
            try:
                with _unwritten_is_nan(fresh):
                    out = self.target(*new_args, **new_kwargs)
            except Exception as exc:  # noqa: BLE001 - a kernel that raises where the stock op works is wrong there
                check.add_finding("unseen_shape", f"{where}: raised {type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
                                                  " where the stock op works")
                continue
            problems = [f"{metric}: {detail}" for metric, detail in _layout_findings(out, stock).items()]
            if not problems:  # values only where the layout matches (a shape mismatch cannot be compared)
                problems = self._agreement(out, stock, reference).problems
            if problems:
                check.add_finding("unseen_shape", f"{where}: {'; '.join(problems)}"[:300])

    def _check_stress(self, check: OpCheck, args: tuple, kwargs: dict) -> None:
        """The same call on its own inputs moved across the range the op can meet (e2eprof.stress), forward and
        backward, each judged against the stock op and fp64; held to the stock op where the stock op overflows."""
        started = time.perf_counter()
        self._check_points(check, stress.points(args, kwargs, self.skip, self.patch.domain,
                                                row_length_free=self._row_length_free(args)))
        check.stress_s += time.perf_counter() - started

    def _check_backward(self, check: OpCheck, args: tuple, kwargs: dict) -> None:
        """The call's own inputs, backward only (its forward is the per-call check's): where the unseen-shape and
        stress checks are left out, the gradients of these values are still judged (a trained-like model's calls)."""
        self._check_points(check, [("as-called inputs", args, kwargs)], directions=("backward",))

    def _check_points(self, check: OpCheck, points, directions=("forward", "backward")) -> None:
        """Each (name, args, kwargs) point through the kernel, the stock op and the fp64 reference, in each direction."""
        runs = {"forward": stress.forward, "backward": stress.backward}
        for name, new_args, new_kwargs in points:
            for direction, run in ((d, runs[d]) for d in directions):
                try:
                    stock, reference = run(self.original, self.patch.reference, new_args, new_kwargs, self.skip,
                                           reference=True)
                except Exception:  # noqa: BLE001 - the stock op does not take this input: nothing is owed
                    continue
                if stock is None or not stress.judgeable(reference):  # not differentiable here, or an exact zero
                    continue                                      # that no relative error can judge
                check.stress_points += 1
                if name.split(" ")[0] not in check.stress_kinds:
                    check.stress_kinds.append(name.split(" ")[0])
                where = f"{name}, {direction}"
                try:
                    out = run(self.target, None, new_args, new_kwargs, self.skip)[0]
                except Exception as exc:  # noqa: BLE001 - a kernel that raises where the stock op works is wrong
                    check.add_finding("stress", f"{where}: raised {type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
                                                " where the stock op works")
                    continue
                problems = [f"{metric}: {detail}" for metric, detail in _layout_findings(out, stock).items()
                            if metric != "nan_inf_positions"]
                if not problems:
                    floor = self.patch.tolerance_for(str(getattr(stock, "dtype", "")).removeprefix("torch."))
                    problems = stress.judge(out, stock, reference, floor=floor, factor=self.patch.error_factor).problems
                if problems:
                    check.add_finding("stress", f"{where}: {'; '.join(problems)}"[:300])

    def _compare(self, check: OpCheck, out, stock, reference) -> None:
        result = self._agreement(out, stock, reference)
        check.patched_error = max(check.patched_error, result.patched_error)
        check.stock_error = max(check.stock_error, result.stock_error)
        check.tolerance = max(check.tolerance, result.tolerance)
        if not result.passed:
            check.passed = False
            for problem in result.problems:
                if problem not in check.problems:
                    check.problems.append(problem)


def _other_device_agreement(out: torch.Tensor, stock: torch.Tensor, reference, floor: float, factor: float) -> Agreement:
    """A failed agreement for an output on another device, with its values judged on the stock output's device.

    Comparing across devices would raise (and a crash would hide the finding); a meta output has no values at all.
    """
    where = f"device {out.device} != stock {stock.device}"
    if out.is_meta:
        return Agreement(False, math.inf, math.nan, floor, [f"{where}: the output holds no values"])
    result = compare_to_reference(out.to(stock.device), stock, reference, floor=floor, factor=factor)
    return Agreement(False, result.patched_error, result.stock_error, result.tolerance, [where, *result.problems])


_ABSENT = object()  # _Change.previous of an attribute that did not exist: revert deletes it


@dataclass
class _Change:
    owner: object
    attribute: str
    previous: object


@dataclass
class AppliedPatch:
    """A patch in force: its recorders, the sites it replaced, and how to undo it."""

    patch: Patch
    recorders: list[CallRecorder]
    sites: list[dict]
    _changes: list[_Change]
    _class_swaps: list[tuple[torch.nn.Module, type]] = field(default_factory=list)

    @property
    def calls(self) -> int:
        return sum(r.calls for r in self.recorders)

    @property
    def n_sites(self) -> int:
        return sum(s["count"] for s in self.sites)

    def signatures(self) -> Counter[str]:
        """Calls per argument signature, formatted ('float32[8,12,1024,1024], dim=-1')."""
        total: Counter[str] = Counter()
        for recorder in self.recorders:
            for key, count in recorder.signatures.items():
                total[format_signature(key)] += count
        return total

    def set_mark_ranges(self, on: bool) -> None:
        """Wrap each call in a profiler range named e2eprof.replaced::<patch> (profiling phase only)."""
        for recorder in self.recorders:
            recorder.mark_ranges = on

    def set_verify(self, on: bool, extended: bool = True) -> None:
        """Verify every call (or stop); extended=False leaves out the unseen-shape and stress checks, which move a
        call's inputs to shapes and ranges of their own and so need running only once per signature per run."""
        for recorder in self.recorders:
            recorder.verify = on
            recorder.extended = extended

    def checks(self) -> list[OpCheck]:
        return [check for r in self.recorders for check in r.checks.values()]

    def revert(self) -> None:
        """Put back exactly what apply() replaced, in reverse order."""
        for change in reversed(self._changes):
            if change.previous is _ABSENT:
                delattr(change.owner, change.attribute)
            else:
                setattr(change.owner, change.attribute, change.previous)
        for module, cls in reversed(self._class_swaps):
            module.__class__ = cls
        self._changes.clear()
        self._class_swaps.clear()


def _resolve(target: str) -> tuple[types.ModuleType, list[str], list[object]]:
    """Import the target's module and walk its attribute path; return the module, path and objects on it."""
    module_name, _, path = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a module that raises anything on import is a bad target, said in one line
        raise PatchError(f"target {target}: module '{module_name}' cannot be imported "
                         f"({' '.join(f'{type(exc).__name__}: {exc}'.split())}){_nearby_modules(module_name)}") from None
    parts = path.split(".")
    objects: list[object] = [module]
    for depth, part in enumerate(parts):
        owner = objects[-1]
        if not hasattr(owner, part):
            where = module_name + "".join("." + p for p in parts[:depth])
            raise PatchError(
                f"target {target}: '{where}' has no attribute '{part}'{_nearby_names(part, dir(owner))} "
                f"(the modeling code may have changed in this transformers version)"
            )
        objects.append(getattr(owner, part))
    return module, parts, objects


def _nearby_names(name: str, names: list[str]) -> str:
    """'; nearby: a, b, c' for the names closest to `name` (what the user probably meant), or ''."""
    close = difflib.get_close_matches(name, [n for n in names if not n.startswith("__")], n=3, cutoff=0.6)
    return f"; nearby: {', '.join(close)}" if close else ""


def _nearby_modules(module_name: str) -> str:
    """Sibling modules of a module that failed to import, the closest first (a typo in a path is the usual cause)."""
    parent, _, leaf = module_name.rpartition(".")
    try:
        package = importlib.import_module(parent) if parent else None
    except Exception:  # only a hint for an error already being raised: no hint beats a second failure
        return ""
    if package is None or not hasattr(package, "__path__"):
        return ""
    return _nearby_names(leaf, [info.name for info in pkgutil.iter_modules(package.__path__)])


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def signature_mismatch(replaced: Callable, replacement: Callable) -> str | None:
    """Why `replacement` cannot take every call that `replaced` takes, naming the parameter; None when it can.

    The model calls the replacement exactly as it called the stock function, positionally or by keyword, so
    each of the stock function's parameters must exist in the replacement at the same position, with the same
    name (unless positional-only) and kind, and keep its default. The replacement may take more: *args/**kwargs,
    or extra parameters with defaults. Callables without a readable signature (some builtins) are not compared.
    """
    try:
        want, have = inspect.signature(replaced), inspect.signature(replacement)
    except (TypeError, ValueError):
        return None
    have_params = list(have.parameters.values())
    have_positional = [p for p in have_params if p.kind in _POSITIONAL]
    have_keyword = {p.name: p for p in have_params if p.kind is not inspect.Parameter.POSITIONAL_ONLY}
    var_args = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in have_params)
    var_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in have_params)
    matched: set[str] = set()
    want_positional = [p for p in want.parameters.values() if p.kind in _POSITIONAL]
    for p in want.parameters.values():
        kind = p.kind.description
        if p.kind is inspect.Parameter.VAR_POSITIONAL and not var_args:
            return f"the replaced function takes *{p.name}, the replacement has no *args"
        if p.kind is inspect.Parameter.VAR_KEYWORD and not var_kwargs:
            return f"the replaced function takes **{p.name}, the replacement has no **kwargs"
        if p.kind in _POSITIONAL:
            index = want_positional.index(p)
            mine = have_positional[index] if index < len(have_positional) else None
            if mine is None:
                if var_args and (p.kind is inspect.Parameter.POSITIONAL_ONLY or var_kwargs):
                    continue
                return (f"parameter {index + 1} '{p.name}' ({kind}) of the replaced function is missing from the "
                        f"replacement, which takes {len(have_positional)} positional parameter(s)")
            matched.add(mine.name)
            if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and mine.kind is inspect.Parameter.POSITIONAL_ONLY:
                return (f"parameter {index + 1} '{mine.name}' is positional-only in the replacement but {kind} "
                        f"('{p.name}') in the replaced function")
            if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and mine.name != p.name:
                return (f"parameter {index + 1} is '{mine.name}' in the replacement but '{p.name}' in the replaced "
                        f"function (callers may pass it by name)")
        elif p.kind is inspect.Parameter.KEYWORD_ONLY:
            mine = have_keyword.get(p.name)
            if mine is None:
                if var_kwargs:
                    continue
                return f"keyword-only parameter '{p.name}' of the replaced function is missing from the replacement"
            matched.add(mine.name)
        else:
            continue
        if p.default is not inspect.Parameter.empty and mine.default is inspect.Parameter.empty:
            return (f"parameter '{p.name}' has a default in the replaced function but none in the replacement "
                    f"(callers may leave it out)")
    for mine in have_params:
        required = mine.default is inspect.Parameter.empty and mine.kind not in (
            inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        if required and mine.name not in matched:
            return f"the replacement requires parameter '{mine.name}', which the replaced function does not have"
    return None


def check_targets(patch: Patch) -> None:
    """Raise PatchError when a target does not exist or the replacement's signature does not fit it.

    Run before any measurement (check_model_fits calls it), so a typo in a target or a wrongly declared
    replacement is one precise line instead of a crashed arm.
    """
    for target in patch.targets:
        _, _, objects = _resolve(target)
        original = objects[-1]
        if isinstance(original, type):
            # A class target's replacement is a subclass; its forward is what the model calls instead.
            replaced, replacement, what = original.forward, getattr(patch.replacement, "forward", None), "forward of "
            if replacement is None or replacement is replaced:
                continue
        else:
            replaced, replacement, what = original, patch.replacement, ""
        problem = signature_mismatch(replaced, replacement)
        if problem:
            raise PatchError(f"patch '{patch.name}': the {what}replacement does not match the signature of "
                             f"{target}: {problem}")


def check_model_fits(patch: Patch, architecture: str, attn_implementation: str | None) -> None:
    """Raise PatchError when the patch does not apply to this architecture or attention implementation, or when
    a target does not exist or its replacement's signature does not fit (check_targets)."""
    if patch.architectures and architecture not in patch.architectures:
        # Name what the patch replaces, so the user sees why another family's model (its own modeling code,
        # its own classes) never reaches it.
        raise PatchError(
            f"patch '{patch.name}' applies to {', '.join(patch.architectures)}; this model is '{architecture}', "
            f"whose code never reaches what the patch replaces ({', '.join(patch.targets)})"
        )
    if patch.attn_implementation and attn_implementation and attn_implementation != patch.attn_implementation:
        raise PatchError(
            f"patch '{patch.name}' needs attn_implementation='{patch.attn_implementation}', "
            f"the model uses '{attn_implementation}' (which never calls the replaced function)"
        )
    check_targets(patch)


def apply_patch(patch: Patch, model: torch.nn.Module | None = None, *, passthrough: bool = False) -> AppliedPatch:
    """Install `patch` at all its targets; with a model, also swap classes of existing instances.

    Resolves every target first, so a patch with one bad target changes nothing. Raises PatchError when a
    target does not exist or the patch would replace zero sites. With passthrough=True the recorder calls the
    stock function (a stock arm's profiling instrument): no class is swapped, the model's instances of a class
    target only get a counting forward, and the model need not fit the patch (a reference arm's attention differs).
    """
    if model is not None and not passthrough:
        config = getattr(model, "config", None)
        check_model_fits(patch, getattr(config, "model_type", ""), getattr(config, "_attn_implementation", None))
    resolved = [(target, *_resolve(target)) for target in patch.targets]
    if model is not None:
        # The model's own modeling module's targets first: when two targets resolve to one class (nn.LayerNorm as
        # modeling_gpt2 and modeling_bert see it), the model's instances are counted under its own target.
        resolved.sort(key=lambda r: r[0].partition(":")[0] != type(model).__module__)
    applied = AppliedPatch(patch, recorders=[], sites=[], _changes=[])
    try:
        for target, module, parts, objects in resolved:
            original = objects[-1]
            if isinstance(original, type):
                _apply_class(applied, target, module, parts, original, model, passthrough)
            else:
                _apply_function(applied, target, module, parts, objects, original, passthrough)
    except Exception:
        applied.revert()
        raise
    if applied.n_sites == 0 and not passthrough:
        applied.revert()
        raise PatchError(f"patch '{patch.name}' replaced zero sites in this model")
    return applied


def _install(applied: AppliedPatch, target: str, module, parts: list[str], new: object) -> None:
    """Put `new` at `parts` as `module` sees it, recording the change; never mutates a shared module."""
    # Walk the live path, not the one resolved before applying: an earlier target of this patch may already
    # have put a proxy on it, and that proxy must be extended, not overwritten.
    objects: list[object] = [module]
    for part in parts[:-1]:
        objects.append(getattr(objects[-1], part))
    # Find the outermost shared module on the path: proxy from there down so nothing outside `module` changes.
    first_shared = next(
        (i for i in range(1, len(parts)) if isinstance(objects[i], types.ModuleType) and objects[i] is not module),
        None,
    )
    if first_shared is None:
        owner = objects[-1]
        if isinstance(owner, type):
            # A plain callable stored on a class is not bound to instances (and staticmethods, classmethods and
            # inherited attributes would not be restored exactly): the model would break or stay changed.
            raise PatchError(
                f"target {target}: '{parts[-1]}' is an attribute of class {owner.__name__}; replace the class "
                f"with a subclass instead (target '{target.partition(':')[0]}:{'.'.join(parts[:-1])}')"
            )
        applied._changes.append(_Change(owner, parts[-1], getattr(owner, parts[-1])))
        setattr(owner, parts[-1], new)
        return
    for i in range(len(parts) - 1, first_shared - 1, -1):
        if not isinstance(objects[i], types.ModuleType):
            raise PatchError(f"target {target}: cannot scope a replacement inside non-module '{parts[i - 1]}'")
        new = ModuleProxy(objects[i], {parts[i]: new})
    owner = objects[first_shared - 1]
    applied._changes.append(_Change(owner, parts[first_shared - 1], objects[first_shared]))
    setattr(owner, parts[first_shared - 1], new)


def _apply_function(applied: AppliedPatch, target: str, module, parts: list[str], objects: list, original,
                    passthrough: bool = False) -> None:
    if not callable(original):
        raise PatchError(f"target {target}: '{parts[-1]}' is not callable")
    recorder = CallRecorder(applied.patch, original, passthrough)
    _install(applied, target, module, parts, recorder)
    applied.recorders.append(recorder)
    applied.sites.append({"target": target, "kind": "function", "count": 1})


def _apply_class(applied: AppliedPatch, target: str, module, parts: list[str], original: type, model,
                 passthrough: bool = False) -> None:
    replacement = applied.patch.replacement
    if not (isinstance(replacement, type) and issubclass(replacement, original)):
        raise PatchError(f"target {target} is a class; the replacement must be a subclass of {original.__name__}")
    if not passthrough:
        _install(applied, target, module, parts, replacement)
    # One recorder for all instances: each instance's forward becomes the recorder bound to it, so calls are
    # counted and, in verify mode, checked against the stock forward and the reference like function targets.
    # Passthrough: the recorder calls the stock forward, and only stock instances are instrumented.
    recorder = CallRecorder(applied.patch, original.forward, passthrough, target=replacement.forward, method=True)
    count = 0
    # An instance an earlier target of this patch already took is counted once, by that target: two targets can
    # resolve to one class (nn.LayerNorm as two modeling modules see it), or share one replacement subclass.
    taken = {id(c.owner) for c in applied._changes if c.attribute == "forward"}
    if model is not None:
        for sub in model.modules():
            if type(sub) not in ((original,) if passthrough else (original, replacement)) or id(sub) in taken:
                continue
            if "forward" in vars(sub):
                # The instance attribute would run instead of the replacement's forward: nothing would change.
                raise PatchError(f"target {target}: a {original.__name__} instance has its own forward attribute "
                                 f"(set by a hook library?), so replacing its class would not take effect")
            if type(sub) is original and not passthrough:
                applied._class_swaps.append((sub, original))
                sub.__class__ = replacement
            applied._changes.append(_Change(sub, "forward", _ABSENT))
            sub.forward = types.MethodType(recorder, sub)  # deepcopy rebinds it to the copy
            count += 1
    applied.recorders.append(recorder)
    applied.sites.append({"target": target, "kind": "class", "count": count})
