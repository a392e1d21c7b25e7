"""Report rows of the anti-cheat checks: one correctness row per metric of CALL_CHECK_METRICS over all calls."""

from __future__ import annotations


# The anti-cheat checks of verify mode (GUIDE section 3; README "What e2eprof checks"): metric -> what failing it
# means. Each is its own correctness row, so a report names the trick, not just "incorrect". Only top-level tensor
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
    "unseen_shape": "wrong results, or a raise, on neighbouring shapes the model did not use (e2eprof.checks.unseen_shapes)",
    "stress": "wrong results, forward or backward, on inputs across the range the op can meet (e2eprof.checks.stress)",
}


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
