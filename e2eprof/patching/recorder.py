"""The verified call: the callable installed at every target of a patch, and what it records.

`CallRecorder` counts calls and their argument signatures; in verify mode it also runs the stock function and
the fp64 reference on the same arguments, records how far the patched output is from each (`OpCheck`), and runs
the anti-cheat checks on every call (`e2eprof.patching.checks`; the metrics are `rows.CALL_CHECK_METRICS`:
poisoned allocator, inputs compared before/after, output kind, a repeat on copies, new contents at the same
address, threads left running), plus once per signature the unseen-shape and stress checks.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from e2eprof.checks import stress
from e2eprof.patch import Patch
from e2eprof.patching.checks import (UNUSABLE, fresh_contents, holds_values, identical, layout_findings, map_tensors,
                                     other_device_agreement, tensor_inputs, tensor_items, to_float64, unwritten_is_nan,
                                     writable)
from e2eprof.patching.signatures import format_signature, signature_key
from e2eprof.checks.tensorcheck import Agreement, compare_to_reference
from e2eprof.checks.unseen_shapes import neighbours


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
    stress_points: int = 0  # stress points checked (e2eprof.checks.stress), forward and backward each counted once
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
        key = signature_key(args[self.skip:], kwargs)
        self.signatures[key] += 1
        if self.verify:
            return self._verified_call(format_signature(key), args, kwargs)
        if self.mark_ranges:
            with torch.profiler.record_function(self.range_name):
                return self.target(*args, **kwargs)
        return self.target(*args, **kwargs)

    def _verified_call(self, signature: str, args: tuple, kwargs: dict):
        """The model's call, plus every per-call check of verify mode (e2eprof.patching.checks)."""
        check = self.checks.setdefault(signature, OpCheck(signature))
        check.calls += 1
        inputs = tensor_inputs(args[self.skip:], kwargs)
        before = [t.detach().clone() for t in inputs]
        threads = threading.active_count()
        with unwritten_is_nan(inputs):
            out = self.target(*args, **kwargs)
        started = threading.active_count() - threads
        if started > 0:
            check.add_finding("threads_leaked", f"{started} Python thread(s) still running after the call returned")
        mutated = [i for i, (t, b) in enumerate(zip(inputs, before)) if not identical(t, b)]
        if mutated and not self._stock_mutates(args, kwargs, before):
            check.add_finding("input_mutated", f"tensor argument(s) {mutated} changed by the call")
        with torch.no_grad():
            # A call that changed its inputs leaves the stock op nothing fair to run on: it gets copies of the
            # inputs as they were before the call.
            stock, reference = self._expected(*((args, kwargs) if not mutated else _refill(args, kwargs, self.skip, before)))
            self._compare(check, out, stock, reference)
            findings = self._layout(out, stock)
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
            # The inputs' device, not the output's: a tuple or model output has none, and autocast must be off there.
            device_type = next((t.device.type for t in tensor_inputs(args[self.skip:], kwargs)), "cpu")
            with torch.autocast(device_type, enabled=False):
                reference = self.patch.reference(*[to_float64(a) for a in args], **{k: to_float64(v) for k, v in kwargs.items()})
        else:
            reference = _doubled(stock)
        return stock, reference

    def _fields(self, out, stock: Mapping, reference) -> tuple[list, list, list]:
        """A model output (loss, logits, ...) as parallel lists of its tensor fields, leaving out the fields the patch
        declares it omits (Patch.omitted_outputs) where the patched output indeed has none."""
        keys = [k for k, v in stock.items() if isinstance(v, torch.Tensor)
                and not (k in self.patch.omitted_outputs and _field(out, k) is None)]
        return [_field(out, k) for k in keys], [stock[k] for k in keys], [_field(reference, k) for k in keys]

    def _layout(self, out, stock) -> dict[str, str]:
        if isinstance(stock, Mapping):
            outs, stocks, _ = self._fields(out, stock, None)
            return layout_findings(outs, stocks)
        return layout_findings(out, stock)

    def _agreement(self, out, stock, reference):
        if isinstance(stock, Mapping):
            outs, stocks, refs = self._fields(out, stock, reference)
            missing = [k for k, o in zip((k for k, v in stock.items() if isinstance(v, torch.Tensor)), outs)
                       if not isinstance(o, torch.Tensor)]
            if missing:
                return Agreement(False, math.inf, math.nan, 0.0, [f"output has no {', '.join(missing)} (the stock "
                                                                  f"output does; the patch does not declare it omitted)"])
            return self._tuple_agreement(outs, stocks, refs)
        items = tensor_items(stock)
        if items is not None:
            return self._tuple_agreement(out, items, tensor_items(reference))
        floor = self.patch.tolerance_for(str(getattr(stock, "dtype", "")).removeprefix("torch."))
        if type(out) is torch.Tensor and isinstance(stock, torch.Tensor) and out.device != stock.device:
            return other_device_agreement(out, stock, reference, floor, self.patch.error_factor)
        return compare_to_reference(out, stock, reference, floor=floor, factor=self.patch.error_factor)

    def _tuple_agreement(self, out, stock: list, reference: list | None) -> Agreement:
        """Every tensor element of a tuple output judged on its own; the worst one decides."""
        outs = tensor_items(out)
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
            self.original(*map_tensors(args, self.skip, lambda _: next(feed)),
                          **{k: next(feed) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})
        return any(not identical(c, b) for c, b in zip(copies, before))

    def _check_repeatable(self, check: OpCheck, args: tuple, kwargs: dict, out, before: list[torch.Tensor]) -> None:
        """Run again on copies of the original inputs (new address, same contents): the output must be bit-identical.

        Catches kernels that read uninitialised or out-of-bounds memory, race, or key results on an address.
        """
        outs = tensor_items(out) or [out]  # a tuple output (attention) is compared element by element
        if not any(isinstance(o, torch.Tensor) for o in outs) or not holds_values(out):
            return  # a meta output has no bits to repeat (output_device already failed it)
        copies = iter([b.clone() for b in before])
        again = self.target(*map_tensors(args, self.skip, lambda _: next(copies)),
                            **{k: next(copies) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})
        agains = tensor_items(again) or [again]
        same = len(agains) == len(outs) and all(
            isinstance(a, torch.Tensor) and identical(a, o) for a, o in zip(agains, outs) if isinstance(o, torch.Tensor))
        if not same:
            check.add_finding("nondeterministic", "a second call on copies of the same inputs gave a different output")

    def _check_fresh_contents(self, check: OpCheck, args: tuple, kwargs: dict, inputs: list[torch.Tensor],
                              restore: list[torch.Tensor | None]) -> None:
        """Same tensors (same addresses), new contents: the output must follow the new contents.

        Catches results cached by pointer or object id. The model's tensors get their contents back afterwards
        (what the call left in them, so a mutating kernel is not silently repaired).
        """
        floating = [i for i, t in enumerate(inputs) if t.is_floating_point() and t.numel() > 1 and writable(t)]
        if not floating:
            return
        saved = {i: restore[i] if restore[i] is not None else inputs[i].detach().clone() for i in floating}
        try:
            for i in floating:
                inputs[i].data.copy_(fresh_contents(saved[i]))
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
        """The same call on neighbouring shapes the model never used (e2eprof.checks.unseen_shapes), each judged against
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
                with unwritten_is_nan(fresh):
                    out = self.target(*new_args, **new_kwargs)
            except Exception as exc:  # noqa: BLE001 - a kernel that raises where the stock op works is wrong there
                check.add_finding("unseen_shape", f"{where}: raised {type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
                                                  " where the stock op works")
                continue
            problems = [f"{metric}: {detail}" for metric, detail in self._layout(out, stock).items()]
            if not problems:  # values only where the layout matches (a shape mismatch cannot be compared)
                problems = self._agreement(out, stock, reference).problems
            if problems:
                check.add_finding("unseen_shape", f"{where}: {'; '.join(problems)}"[:300])

    def _check_stress(self, check: OpCheck, args: tuple, kwargs: dict) -> None:
        """The same call on its own inputs moved across the range the op can meet (e2eprof.checks.stress), forward and
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
                problems = [f"{metric}: {detail}" for metric, detail in layout_findings(out, stock).items()
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


def _field(value, key: str):
    return value.get(key) if isinstance(value, Mapping) else None


def _doubled(value):
    """The stock output as its own fp64 reference (a patch without one); a model output field by field."""
    if isinstance(value, torch.Tensor):
        return value.double()
    if isinstance(value, Mapping):
        return {k: _doubled(v) for k, v in value.items()}
    return value


def _refill(args: tuple, kwargs: dict, skip: int, tensors: list[torch.Tensor]) -> tuple[tuple, dict]:
    """args and kwargs with their top-level tensors replaced by clones of `tensors` (tensor_inputs' order)."""
    feed = iter([t.clone() for t in tensors])
    return (map_tensors(args, skip, lambda _: next(feed)),
            {k: next(feed) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})
