"""The replaced op alone: check it, then time it against the stock function and torch.compile of the stock function.

For every CallSpec and pass (forward, and forward+backward when the model differentiated through the call):
1. correctness on fresh random inputs, before any timing (op_check.py): the candidate's outputs, and gradients
   for forward+backward, against the patch's fp64 reference, with allocations poisoned and a repeat call;
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

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import pandas as pd
import torch

from e2eprof.microbench.capture import CallSpec, TensorSpec, dtype_name
from e2eprof.microbench.op_calls import (Op, backward, draw_inputs, forward, fresh_grad_outputs, op_for,
                                         poisoned_allocations, tensors_of)
from e2eprof.microbench.op_check import check
from e2eprof.microbench.plausibility import judge_bandwidth
from e2eprof.microbench.timing import Samples, Timer, copy_rates
from e2eprof.patch import Patch

# The public names: those defined here and the call helpers tests and benchmarks import from here.
__all__ = ["IMPLS", "MIN_TRIALS", "op_bytes", "bench_spec", "add_derived", "run_microbench", "draw_inputs", "op_for",
           "poisoned_allocations"]

IMPLS = ("replacement", "eager", "compile")
MIN_TRIALS = 30


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
