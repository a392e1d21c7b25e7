"""Model-level correctness gate: each arm's outputs against the fp64 reference, the stock arm as yardstick.

For every captured tensor (loss, logits, every parameter's gradient, prefill logits) an arm passes when its
relative-norm error against the fp64 reference is at most max(k * the baseline's error, floor). Greedy tokens
are compared by agreement: an arm may not agree with the fp64 tokens much less often than the baseline does.
"""

from __future__ import annotations

import math
import os

import torch
from safetensors.torch import load_file

from e2eprof.patch import Patch
from e2eprof.checks.tensorcheck import error_norms, ratio_of_norms, reference_facts

PRECISION_DTYPE_NAME = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp64": "float64"}
TOKEN_AGREEMENT_SLACK = 0.10  # random-weight models have near-tied logits: a flip or two is not a bug
# A gradient whose fp64 reference is this small next to the whole model's gradient is zero in exact arithmetic
# (e.g. BERT's attention key bias: softmax ignores a per-row constant). Its relative error is rounding noise over
# rounding noise, so it is judged against the whole gradient's norm instead.
NEGLIGIBLE_GRADIENT = 1e-6


def _row(workload, arm, tensor, metric, value, tolerance, passed, detail=""):
    return {"workload": workload, "arm": arm, "tensor": tensor, "metric": metric, "value": float(value),
            "tolerance": float(tolerance), "passed": bool(passed), "detail": detail}


def _token_agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return 0.0
    return (a == b).double().mean().item() if a.numel() else 1.0


# (reference file, baseline file, and both files' inode, size and change times) -> (facts, stock_norms): the gate,
# the revalidation and every later candidate judge against the same two files.
_YARDSTICKS: dict[tuple, tuple[dict, dict]] = {}
_YARDSTICKS_KEPT = 4


def _yardstick(reference_path: str, baseline_path: str, reference: dict, baseline: dict) -> tuple[dict, dict]:
    """The reference's own norms and the baseline's errors against it, per tensor: computed once per pair of files.
    Gradients (a 124M-parameter model's worth in fp64) dominate the cost, seconds of the parent's time on a small
    CPU, which the revalidation and each further candidate would otherwise pay again."""
    key = tuple((path, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
                for path in (reference_path, baseline_path) for stat in (os.stat(path),))
    if key not in _YARDSTICKS:
        facts = {k: reference_facts(ref) for k, ref in reference.items() if k != "tokens"}
        stock_norms = {k: error_norms(baseline[k], reference[k], facts[k]) for k in set(reference) & set(baseline)
                       if k != "tokens" and baseline[k].shape == reference[k].shape}
        if len(_YARDSTICKS) >= _YARDSTICKS_KEPT:
            _YARDSTICKS.pop(next(iter(_YARDSTICKS)))
        _YARDSTICKS[key] = facts, stock_norms
    return _YARDSTICKS[key]


def compare_captures(workload: str, reference_path: str, captures: dict[str, str], patch: Patch, precision: str) -> list[dict]:
    """Correctness rows for every arm in `captures` (must include 'baseline') against the fp64 reference."""
    reference = load_file(reference_path)
    outputs = {arm: load_file(path) for arm, path in captures.items()}
    baseline = outputs["baseline"]
    floor = patch.tolerance_for(PRECISION_DTYPE_NAME[precision])
    facts, stock_norms = _yardstick(reference_path, captures["baseline"], reference, baseline)
    grad_scale_sq = sum(den for key, (_, den) in stock_norms.items() if key.startswith("grad/"))
    rows: list[dict] = []
    for arm, tensors in outputs.items():
        omitted = sorted(set(reference) - set(tensors)) if arm != "baseline" else []
        omitted = [key for key in omitted if key in patch.omitted_outputs]
        if omitted:  # by the patch's declaration (a fused loss never materialises the logits): said, not failed
            rows.append(_row(workload, arm, ",".join(omitted), "omitted_outputs", len(omitted), math.nan, True,
                             f"patch '{patch.name}' does not return these by design; loss and gradients are compared"))
        missing = sorted(set(reference) - set(tensors) - set(omitted))
        if missing:
            rows.append(_row(workload, arm, ",".join(missing[:5]), "missing_outputs", len(missing), 0, False,
                             "the arm did not produce these outputs"))
        grads = {"arm": [0.0, 0.0], "stock": [0.0, 0.0], "count": 0, "stock_complete": True}
        for key in sorted(set(reference) & set(tensors)):
            ref, value = reference[key], tensors[key]
            if key == "tokens":
                rows += _token_rows(workload, arm, value, baseline[key], ref)
                continue
            if value.shape != ref.shape:
                rows.append(_row(workload, arm, key, "shape_mismatch", math.nan, math.nan, False,
                                 f"{tuple(value.shape)} vs reference {tuple(ref.shape)}"))
                continue
            if arm == "baseline" and key in stock_norms:
                norms = stock_norms[key]
            else:
                norms = error_norms(value, ref, facts[key])
            metric, basis = "rel_error_vs_fp64", None
            if key.startswith("grad/") and norms[1] < NEGLIGIBLE_GRADIENT**2 * grad_scale_sq:
                metric, basis = "error_vs_model_gradient_norm", grad_scale_sq
            error = ratio_of_norms(norms[0], basis if basis is not None else norms[1])
            stock = (ratio_of_norms(stock_norms[key][0], basis if basis is not None else stock_norms[key][1])
                     if key in stock_norms else math.nan)
            tolerance = max(patch.error_factor * stock, floor) if math.isfinite(stock) else floor
            passed = arm == "baseline" or error <= tolerance
            detail = "yardstick (stock path)" if arm == "baseline" else f"baseline error {stock:.3g}"
            if basis is not None:
                detail += "; reference is ~0 (zero in exact arithmetic): error relative to the whole gradient's norm"
            rows.append(_row(workload, arm, key, metric, error, tolerance, passed, detail))
            if key.startswith("grad/"):
                _accumulate(grads, norms, stock_norms.get(key))
        if grads["count"]:
            error = ratio_of_norms(*grads["arm"])
            stock = ratio_of_norms(*grads["stock"]) if grads["stock_complete"] else math.nan
            tolerance = max(patch.error_factor * stock, floor) if math.isfinite(stock) else floor
            rows.append(_row(workload, arm, "grad/*", "rel_error_vs_fp64", error, tolerance,
                             arm == "baseline" or error <= tolerance, f"all {grads['count']} gradients together"))
    return rows


def _accumulate(grads: dict, norms: tuple[float, float], stock: tuple[float, float] | None) -> None:
    """Add one gradient's squared norms to the whole-model totals (squared norms add across tensors)."""
    grads["count"] += 1
    grads["arm"][0] += norms[0]
    grads["arm"][1] += norms[1]
    if stock is None:
        grads["stock_complete"] = False
    else:
        grads["stock"][0] += stock[0]
        grads["stock"][1] += stock[1]


def _token_rows(workload: str, arm: str, value, baseline, reference) -> list[dict]:
    stock_agree = _token_agreement(baseline, reference)
    agree = _token_agreement(value, reference)
    tolerance = stock_agree - TOKEN_AGREEMENT_SLACK
    rows = [_row(workload, arm, "tokens", "token_agreement_vs_fp64", agree, tolerance,
                 arm == "baseline" or agree >= tolerance, f"baseline agrees {stock_agree:.3f}")]
    if arm != "baseline":
        rows.append(_row(workload, arm, "tokens", "token_agreement_vs_baseline", _token_agreement(value, baseline),
                         math.nan, True, "informational"))
    return rows


def op_check_rows(workload: str, arm: str, checks: list[dict]) -> list[dict]:
    """Rows for the op-level checks the patched arm made on every call during capture."""
    return [
        _row(workload, arm, check["signature"], "op_rel_error_vs_fp64", check["patched_error"], check["tolerance"],
             check["passed"], "; ".join(check["problems"]) or f"{check['calls']} calls, stock error {check['stock_error']:.3g}")
        for check in checks
    ]
