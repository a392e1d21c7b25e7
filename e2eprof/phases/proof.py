"""Proof that the patch ran and moved nothing off the clock: kernel counters per arm, threads left by timed steps."""

from __future__ import annotations

from e2eprof.candidates import is_candidate


def thread_rows(workload: str, steps: list[dict]) -> list[dict]:
    """Python threads a step left running (work done off the clock), each candidate arm against the baseline's own."""
    left = {}
    for step in steps:
        left[step["arm"]] = left.get(step["arm"], 0) + max(step.get("threads_delta", 0), 0)
    stock = left.get("baseline", 0)
    return [{"workload": workload, "arm": arm, "tensor": "-", "metric": "step_threads_leaked",
             "value": float(count), "tolerance": float(stock), "passed": count <= stock,
             "detail": f"threads still running at the end of timed steps: {arm} {count}, baseline {stock}"}
            for arm, count in left.items() if is_candidate(arm)]


def kernel_ran_rows(workload: str, before: dict, after: dict) -> list[dict]:
    """Prove each candidate's custom kernel ran in its arm during this workload, and never in the stock arms."""
    rows = []

    def row(arm, metric, value, tolerance, passed, detail):
        rows.append({"workload": workload, "arm": arm, "tensor": "-", "metric": metric, "value": value,
                     "tolerance": tolerance, "passed": passed, "detail": detail})

    for arm, end in after.items():
        start = before.get(arm)
        if end is None or start is None:
            continue
        if is_candidate(arm):
            wrapper = end["wrapper_calls"] - start["wrapper_calls"]
            row(arm, "patched_calls", wrapper, 1, wrapper > 0, "calls into the installed replacement")
        if end["implementations"] is None:
            continue  # the patch declares no implementation counter: wrapper calls are all the evidence there is
        impl = {k: v - start["implementations"].get(k, 0) for k, v in end["implementations"].items()}
        calls = sum(impl.values())
        detail = ", ".join(f"{k}={v}" for k, v in sorted(impl.items()) if v) or "no implementation calls"
        if is_candidate(arm):
            row(arm, "custom_kernel_calls", calls, 1, calls > 0, detail)
        else:
            row(arm, "custom_kernel_calls", calls, 0, calls == 0, detail + " (must be zero: this arm is stock)")
    return rows
