"""Proof that the patch ran and moved nothing off the clock: kernel counters per arm, threads left by timed steps."""

from __future__ import annotations


def thread_rows(workload: str, steps: list[dict]) -> list[dict]:
    """Python threads a step left running (work done off the clock), patched arm against the baseline's own."""
    left = {}
    for step in steps:
        left[step["arm"]] = left.get(step["arm"], 0) + max(step.get("threads_delta", 0), 0)
    if "patched" not in left:
        return []
    stock = left.get("baseline", 0)
    return [{"workload": workload, "arm": "patched", "tensor": "-", "metric": "step_threads_leaked",
             "value": float(left["patched"]), "tolerance": float(stock), "passed": left["patched"] <= stock,
             "detail": f"threads still running at the end of timed steps: patched {left['patched']}, baseline {stock}"}]


def kernel_ran_rows(workload: str, before: dict, after: dict) -> list[dict]:
    """Prove the custom kernel ran in the patched arm during this workload, and never in the others."""
    rows = []

    def row(arm, metric, value, tolerance, passed, detail):
        rows.append({"workload": workload, "arm": arm, "tensor": "-", "metric": metric, "value": value,
                     "tolerance": tolerance, "passed": passed, "detail": detail})

    for arm, end in after.items():
        start = before.get(arm)
        if end is None or start is None:
            continue
        if arm == "patched":
            wrapper = end["wrapper_calls"] - start["wrapper_calls"]
            row(arm, "patched_calls", wrapper, 1, wrapper > 0, "calls into the installed replacement")
        if end["implementations"] is None:
            continue  # the patch declares no implementation counter: wrapper calls are all the evidence there is
        impl = {k: v - start["implementations"].get(k, 0) for k, v in end["implementations"].items()}
        calls = sum(impl.values())
        detail = ", ".join(f"{k}={v}" for k, v in sorted(impl.items()) if v) or "no implementation calls"
        if arm == "patched":
            row(arm, "custom_kernel_calls", calls, 1, calls > 0, detail)
        else:
            row(arm, "custom_kernel_calls", calls, 0, calls == 0, detail + " (must be zero: this arm is stock)")
    return rows
