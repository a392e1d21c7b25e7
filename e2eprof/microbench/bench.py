"""The replaced op alone: check it, then time it against the stock function and torch.compile of the stock function.

For every CallSpec and pass (forward, and forward+backward when the model differentiated through the call):
1. correctness on fresh random inputs, before any timing: the candidate runs first with every fresh allocation
   poisoned (NaN), is compared with the patch's fp64 reference under the patch's rule (relative-norm error at most
   max(error_factor * stock error, floor); NaN/Inf where the stock output has them; dtype, shape and strides of the
   stock output), gradients too for forward+backward, then runs again after the stock op and the reference and must
   return the same bits (uninitialised memory that happens to hold a freed correct answer fails one way or the other);
2. timing (timing.py): warm-up, then >= 30 trials, each on freshly drawn inputs (and a fresh grad_output).

A candidate that fails its check is not timed: its row keeps the error and no speedup is claimed for it.

Row columns (one row per spec x impl x pass): impl replacement / eager (the stock op, called as the model calls it)
/ compile (torch.compile of the stock op, mode default, static shapes); median_us, p10_us, p90_us and the raw
samples_us; compile_s = host seconds of the impl's first call in that pass (torch.compile's compilation, Triton's
JIT and autotuning), never part of the timed trials; bytes (see op_bytes), bandwidth_gbs = bytes / median,
roofline_share = bandwidth / copy_gbs (device-to-device copy measured in the same run); floor_share, plausible,
plausibility: the bandwidth floor (plausibility.py: a row faster than a copy fails); error, tolerance, passed,
detail (why it failed or was not run); speedup_vs_eager / speedup_vs_compile = their median / the replacement's,
only where both passed.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import pandas as pd
import torch
import torch.utils.deterministic  # noqa: F401  (poisoned_allocations sets its flag; not imported by torch itself everywhere)

from e2eprof.microbench.capture import CallSpec, TensorSpec, dtype_name
from e2eprof.microbench.plausibility import judge_bandwidth
from e2eprof.microbench.timing import Samples, Timer, copy_rates
from e2eprof.patch import Patch
from e2eprof.patching import CallRecorder
from e2eprof.checks.tensorcheck import compare_to_reference

IMPLS = ("replacement", "eager", "compile")
MIN_TRIALS = 30


# ---- the three callables of one spec --------------------------------------------------------------------------

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


# ---- inputs, calls, poisoning ---------------------------------------------------------------------------------

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


# ---- correctness ------------------------------------------------------------------------------------------------

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


# ---- one spec, all impls and passes -----------------------------------------------------------------------------

def op_bytes(spec: CallSpec, outs: Sequence[TensorSpec], pass_name: str) -> int:
    """Bytes the op must move in one call: every input (and module weight) read once and every output written once;
    backward adds grad_output read, each gradient written, and the smaller of inputs / outputs re-read (backward
    needs one of them, e.g. softmax's y). A lower bound for any implementation, so bandwidth is never overstated."""
    params = [p for p in spec.module.parameters()] if spec.module is not None else []
    inputs = sum(t.nbytes for t in spec.tensors) + sum(p.numel() * p.element_size() for p in params)
    written = sum(o.nbytes for o in outs)
    if pass_name == "fwd":
        return inputs + written
    grads = sum(t.nbytes for t in spec.tensors if t.requires_grad) + sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    return inputs + written + written + grads + min(inputs, written)


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


def _compiled_stock(op: Op) -> Callable:
    # A fresh compilation per spec: dynamo's cache is keyed on the code object, and past its recompile limit it
    # silently runs eager, which would be timed as "compile".
    torch._dynamo.reset()
    eager = op.eager
    return torch.compile(lambda *a, **k: eager(*a, **k), dynamic=False)


def bench_spec(patch: Patch, spec: CallSpec, timer: Timer, *, trials: int, warmup: int, use_compile: bool,
               compile_off_reason: str) -> list[dict]:
    """Rows (one per impl and pass) for one spec; a spec the stock op itself rejects gives one row saying so."""
    op = op_for(patch, spec)
    base = {"source": spec.source, "workload": spec.workload, "signature": spec.signature(),
            "shape": "x".join(map(str, spec.primary.shape)), "dtype_in": dtype_name(spec.primary.dtype),
            "calls_per_step": spec.calls_per_step}
    try:  # learn the outputs' shapes and dtypes (and, for the sweep, whether the stock op accepts this at all)
        outs = [TensorSpec.of(o) for o in tensors_of(forward(op.eager, spec, draw_inputs(spec), False))]
    except Exception as exc:
        return [base | {"impl": "eager", "pass": "fwd", "passed": None, "detail": f"stock op rejects it: {_one_line(exc)}"}]
    base["dtype_out"] = dtype_name(outs[0].dtype) if outs else ""
    passes = ["fwd", "fwd+bwd"] if spec.needs_grad else ["fwd"]
    candidates: dict[str, Callable | None] = {"replacement": op.replacement, "eager": op.eager}
    reasons = {"compile": compile_off_reason}
    if use_compile:
        candidates["compile"] = _compiled_stock(op)
    rows = []
    for impl in IMPLS:
        for pass_name in passes:
            grad = pass_name == "fwd+bwd"
            row = base | {"impl": impl, "pass": pass_name, "bytes": op_bytes(spec, outs, pass_name),
                          "trials": 0, "detail": ""}
            rows.append(row)
            fn = candidates.get(impl)
            if fn is None:
                row |= {"passed": None, "detail": f"not run: {reasons.get(impl, '')}"}
                continue

            def setup(fn=fn, grad=grad):
                inputs = draw_inputs(spec)
                grad_outs = fresh_grad_outputs(outs, spec.device) if grad else []

                def call():
                    out = forward(fn, spec, inputs, grad or spec.grad_enabled)
                    if grad:
                        backward(out, inputs, grad_outs)
                return call

            try:
                # First call apart: Triton JIT, autotuning or torch.compile's compilation (reported, never timed).
                row["compile_s"] = timer.wall_seconds(setup())
                result = check(fn, op, patch, spec, outs, grad)
            except Exception as exc:
                row |= {"passed": False, "error": math.inf, "detail": f"raised {_one_line(exc)}"}
                if impl == "compile":
                    candidates["compile"], reasons["compile"] = None, f"compile failed: {_one_line(exc)}"
                continue
            if impl == "eager":  # the yardstick: its error is the stock error, and it passes by definition
                row |= {"error": result.stock_error, "tolerance": math.nan, "passed": True}
            else:
                row |= {"error": result.error, "tolerance": result.tolerance, "passed": result.passed,
                        "detail": "; ".join(dict.fromkeys(result.problems))}
            if not result.passed and impl != "eager":
                continue  # a wrong answer is not timed: no speedup can be claimed for it
            samples: Samples = timer.measure(setup, trials, warmup)
            row |= {"median_us": samples.median, "p10_us": samples.p10, "p90_us": samples.p90,
                    "trials": len(samples.us), "samples_us": list(samples.us)}
    return rows


def add_derived(frame: pd.DataFrame, copy_gbs: float, copy_ceiling_gbs: float | None = None,
                cache_bytes: int = 0) -> pd.DataFrame:
    """Bandwidth, roofline share, the bandwidth-floor flag and speedups, derived from the raw columns in one place.

    copy_ceiling_gbs: the copy's bandwidth at its fastest trials (default copy_gbs); a timed row moving its bytes
    faster than that (plausibility.py) is flagged `plausible` False and fails, so no speedup is claimed for it.
    """
    frame = frame.copy()
    frame["bandwidth_gbs"] = frame["bytes"] / frame["median_us"] / 1e3  # bytes per microsecond / 1e3 = GB/s
    frame["copy_gbs"] = copy_gbs
    frame["roofline_share"] = frame["bandwidth_gbs"] / copy_gbs
    judged = [judge_bandwidth(b, slow, copy_ceiling_gbs or copy_gbs, cache_bytes)
              for b, slow in zip(frame["bytes"].astype(float), frame["p90_us"].astype(float))]
    frame["floor_share"] = [j.share for j in judged]
    frame["plausible"] = pd.array([j.plausible for j in judged], dtype="boolean")
    frame["plausibility"] = [j.reason for j in judged]
    implausible = frame["plausible"].eq(False).fillna(False).astype(bool)
    if implausible.any():
        frame["passed"] = frame["passed"].astype("boolean")
        frame.loc[implausible, "passed"] = False
        frame.loc[implausible, "detail"] = [f"{d}; {r}" if isinstance(d, str) and d else r
                                            for d, r in zip(frame.loc[implausible, "detail"], frame.loc[implausible, "plausibility"])]
    frame["speedup_vs_eager"] = math.nan
    frame["speedup_vs_compile"] = math.nan
    passed = frame["passed"].fillna(False).astype(bool)
    for _, group in frame[passed].groupby(["source", "workload", "signature", "pass"], sort=False):
        medians = dict(zip(group["impl"], group["median_us"]))
        if "replacement" not in medians:
            continue  # failed or untimed: no speedup is claimed
        index = group.index[group["impl"] == "replacement"]
        for other in ("eager", "compile"):
            if other in medians:
                frame.loc[index, f"speedup_vs_{other}"] = medians[other] / medians["replacement"]
    return frame


def run_microbench(patch: Patch, shapes: Sequence[CallSpec], device: str, *, trials: int = MIN_TRIALS,
                   warmup: int | None = None, use_compile: bool = True, compile_off_reason: str = "not requested",
                   seed: int = 0, progress: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Check and time the patch's replacement, the stock op and torch.compile of it on every spec.

    `shapes` come from `capture_shapes` / `sweep_shapes` (or any CallSpec list); the patch must not be applied.
    Returns one row per spec x impl x pass, with the copy roofline measured in the same run.
    """
    if trials < MIN_TRIALS:
        raise ValueError(f"trials must be >= {MIN_TRIALS}, got {trials}")
    dev = torch.device(device)
    timer = Timer(dev)
    warmup = warmup if warmup is not None else (5 if timer.cuda else 2)
    rows = []
    cuda_index = (dev.index if dev.index is not None else torch.cuda.current_device()) if timer.cuda else None
    # A private RNG stream: the caller's random state is left as it was.
    with torch.random.fork_rng(devices=[cuda_index] if timer.cuda else []):
        torch.manual_seed(seed)
        copy_gbs, copy_ceiling_gbs = copy_rates(timer.copy_samples(trials), timer.copy_bytes)
        for i, spec in enumerate(shapes, 1):
            if spec.module is not None:
                spec = replace(spec, device=str(dev), module=spec.module.to(dev))
            else:
                spec = replace(spec, device=str(dev))
            if progress is not None:
                progress(f"[{i}/{len(shapes)}] {spec.source} {spec.signature()}")
            rows += bench_spec(patch, spec, timer, trials=trials, warmup=warmup, use_compile=use_compile,
                               compile_off_reason=compile_off_reason)
    frame = pd.DataFrame(rows)
    for column in ("median_us", "p10_us", "p90_us", "error", "tolerance", "compile_s", "bytes", "dtype_out"):
        if column not in frame.columns:
            frame[column] = math.nan
    frame["passed"] = frame["passed"].astype("boolean")  # True / False / <NA> (not run)
    frame.insert(0, "patch", patch.name)
    frame["device"] = str(dev)
    return add_derived(frame, copy_gbs, copy_ceiling_gbs, timer.cache_bytes)
