"""Model-level correctness gate: each arm's outputs against the fp64 reference, the stock arm as yardstick.

For every captured tensor (loss, logits, every parameter's gradient, prefill logits) an arm passes when its
relative-norm error against the fp64 reference is at most max(k * the baseline's error, floor). Greedy tokens
are compared by agreement: an arm may not agree with the fp64 tokens much less often than the baseline does.
"""

from __future__ import annotations

import math

import torch
from safetensors.torch import load_file

from e2eprof.patch import Patch
from e2eprof.tensorcheck import relative_error

PRECISION_DTYPE_NAME = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp64": "float64"}
TOKEN_AGREEMENT_SLACK = 0.10  # random-weight models have near-tied logits: a flip or two is not a bug


def _row(workload, arm, tensor, metric, value, tolerance, passed, detail=""):
    return {"workload": workload, "arm": arm, "tensor": tensor, "metric": metric, "value": float(value),
            "tolerance": float(tolerance), "passed": bool(passed), "detail": detail}


def _token_agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return 0.0
    return (a == b).double().mean().item() if a.numel() else 1.0


def compare_captures(workload: str, reference_path: str, captures: dict[str, str], patch: Patch, precision: str) -> list[dict]:
    """Correctness rows for every arm in `captures` (must include 'baseline') against the fp64 reference."""
    reference = load_file(reference_path)
    outputs = {arm: load_file(path) for arm, path in captures.items()}
    baseline = outputs["baseline"]
    floor = patch.tolerance_for(PRECISION_DTYPE_NAME[precision])
    rows: list[dict] = []
    for arm, tensors in outputs.items():
        missing = sorted(set(reference) - set(tensors))
        if missing:
            rows.append(_row(workload, arm, ",".join(missing[:5]), "missing_outputs", len(missing), 0, False,
                             "the arm did not produce these outputs"))
        grad_parts, grad_ref_parts, grad_base_parts = [], [], []
        for key in sorted(set(reference) & set(tensors)):
            ref, value = reference[key], tensors[key]
            if key == "tokens":
                stock_agree = _token_agreement(baseline[key], ref)
                agree = _token_agreement(value, ref)
                tolerance = stock_agree - TOKEN_AGREEMENT_SLACK
                rows.append(_row(workload, arm, key, "token_agreement_vs_fp64", agree, tolerance,
                                 arm == "baseline" or agree >= tolerance, f"baseline agrees {stock_agree:.3f}"))
                if arm != "baseline":
                    rows.append(_row(workload, arm, key, "token_agreement_vs_baseline", _token_agreement(value, baseline[key]),
                                     math.nan, True, "informational"))
                continue
            if value.shape != ref.shape:
                rows.append(_row(workload, arm, key, "shape_mismatch", math.nan, math.nan, False,
                                 f"{tuple(value.shape)} vs reference {tuple(ref.shape)}"))
                continue
            error = relative_error(value, ref)
            stock = relative_error(baseline[key], ref) if key in baseline else math.nan
            tolerance = max(patch.error_factor * stock, floor) if math.isfinite(stock) else floor
            passed = arm == "baseline" or error <= tolerance
            detail = "yardstick (stock path)" if arm == "baseline" else f"baseline error {stock:.3g}"
            rows.append(_row(workload, arm, key, "rel_error_vs_fp64", error, tolerance, passed, detail))
            if key.startswith("grad/"):
                grad_parts.append(value.flatten().double())
                grad_ref_parts.append(ref.flatten().double())
                if key in baseline:
                    grad_base_parts.append(baseline[key].flatten().double())
        if grad_parts:
            ref_all = torch.cat(grad_ref_parts)
            error = relative_error(torch.cat(grad_parts), ref_all)
            stock = relative_error(torch.cat(grad_base_parts), ref_all) if len(grad_base_parts) == len(grad_parts) else math.nan
            tolerance = max(patch.error_factor * stock, floor) if math.isfinite(stock) else floor
            rows.append(_row(workload, arm, "grad/*", "rel_error_vs_fp64", error, tolerance,
                             arm == "baseline" or error <= tolerance, f"all {len(grad_parts)} gradients together"))
    return rows


def op_check_rows(workload: str, arm: str, checks: list[dict]) -> list[dict]:
    """Rows for the op-level checks the patched arm made on every call during capture."""
    return [
        _row(workload, arm, check["signature"], "op_rel_error_vs_fp64", check["patched_error"], check["tolerance"],
             check["passed"], "; ".join(check["problems"]) or f"{check['calls']} calls, stock error {check['stock_error']:.3g}")
        for check in checks
    ]
