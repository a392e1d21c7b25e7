"""One answer for the parent from the answers of every rank of a worker group (gathered on rank 0).

Rows (steps, memory peaks) are kept per rank with a `rank` field; for everything else rank 0 answers and the other
ranks' answers are attached where the parent uses them (profiles, capture files) or folded in where a single value
must hold for every rank (the kernel call counters).
"""

from __future__ import annotations

ROW_COMMANDS = ("cold", "warmup", "block", "memory_peaks")


def merge(command: str, answers: list, patched: bool):
    """answers[r] is rank r's result of `command`; patched: whether this arm applies the patch."""
    if command in ROW_COMMANDS:
        return [row | {"rank": row.get("rank", r)} for r, rows in enumerate(answers) for row in rows]
    first = answers[0]
    if command == "build":
        return first | {"ranks": [{"rank": r, "pid": a["pid"], "device": a.get("device"), "gpu_uuid": a.get("gpu_uuid"),
                                   "batch_digest": a["batch_digest"]} for r, a in enumerate(answers)]}
    if command == "counters":
        return _counters(answers, patched)
    if command == "capture":
        checks = [c | {"rank": r} for r, a in enumerate(answers) for c in a["op_checks"]]
        return first | {"op_checks": checks, "rank_paths": [a["path"] for a in answers]}
    if command == "summarize_profile":
        problems = [f"rank {r}: {p}" for r, a in enumerate(answers) for p in a["problems"]]
        return first | {"result": dict(first["result"], by_rank=[a["result"] for a in answers]), "problems": problems}
    return first


def _counters(answers: list[dict], patched: bool) -> dict:
    """Calls that must hold on every rank. The patched arm proves the kernel ran only if it ran on each rank (the
    fewest calls of any rank); a stock arm is contaminated if any rank ran it (the most)."""
    pick = min if patched else max
    implementations = [a["implementations"] for a in answers]
    merged = None
    if all(i is not None for i in implementations):
        keys = {k for i in implementations for k in i}
        merged = {k: pick(i.get(k, 0) for i in implementations) for k in keys}
    return answers[0] | {"wrapper_calls": pick(a["wrapper_calls"] for a in answers), "implementations": merged,
                         "by_rank": answers}
