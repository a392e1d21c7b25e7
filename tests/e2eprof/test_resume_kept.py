"""resume._kept_rows on hand-made tables: which rows of an interrupted attempt a --resume keeps (no compare run)."""

from __future__ import annotations

from types import SimpleNamespace

from e2eprof import resume
from e2eprof.tables import reports


def _row(workload: str, arm: str, metric: str, passed: bool) -> dict:
    return {"run_id": "r", "point": "p1", "workload": workload, "arm": arm, "tensor": "-", "metric": metric,
            "value": 0.0, "tolerance": 0.0, "passed": passed, "detail": ""}


def test_an_arm_failure_outside_a_workload_stays_with_the_kept_units_of_its_point(tmp_path):
    # Point p1, workloads infer and train: infer finished; the patched arm then died collecting memory peaks
    # (a row of workload "*"); the run was interrupted during train. The kept infer unit measured an arm that
    # failed: dropping the row would let infer's verdict (and the rerun train's) forget it.
    reports.write_table(tmp_path, "correctness", [
        _row("infer", "patched", "max_rel_error", True),
        _row("*", "patched", "arm_failed", False),
        _row("train", "patched", "max_rel_error", True),
    ])
    config = SimpleNamespace(points=[SimpleNamespace(id="p1")], workloads=["infer", "train"])

    kept = resume._kept_rows(tmp_path, config, {"p1/infer": {}})["correctness"]

    assert set(zip(kept.workload, kept.metric)) == {("infer", "max_rel_error"), ("*", "arm_failed")}
