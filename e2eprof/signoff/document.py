"""verdict.json: a run's verdicts for tools that do not read Parquet. Schema "e2eprof.verdict", version 1.

    {"schema": "e2eprof.verdict", "version": 1,
     "run": {"run_id", "status", "model", "patch", "device", "aa", "command_line", "run_dir"},
     "policy": {"file", "min_speedup", "confidence", "correction", "process_noise", "clock_tolerance",
                "temp_tolerance_c", "target_ci"},         # the thresholds these verdicts were judged under
     "verdict": "PASS" | "FAIL" | "INCONCLUSIVE",          # worst over the verdicts below
     "exit_code": 0 | 1 | 3,                                # as `compare` and `gate` exit
     "verdicts": [{"key",                                   # "<workload>", or "<point>/<workload>" in a sweep
                   "point", "batch", "seq", "precision", "workload",
                   "candidate",                             # what is judged against the baseline: patched, baseline-aa,
                                                            # or with several --patch the candidate's label (key
                                                            # then starts "<label>/")
                   "verdict", "reasons": [codes], "advice",
                   "speedup", "ci_low", "ci_high",          # baseline step time / candidate's; null where not measured
                   "confidence", "n"}],                     # the interval's level; timed steps of the candidate
     "candidates": {"ranking", "best", "lead", "gmean"}}    # several --patch only: their ranking (else absent)

A later version adds fields and bumps "version" only for changes that break readers of this one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from e2eprof import candidates as cand
from e2eprof.analysis.verdict import EXIT_CODES, INCONCLUSIVE, worst
from e2eprof.config import AA_ARM, CompareConfig

SCHEMA = "e2eprof.verdict"
VERSION = 1
FILE = "verdict.json"


def _number(value) -> float | None:
    """A finite float, or None (JSON has no NaN)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def build(run_row: dict, config: CompareConfig, summary: list[dict], run_dir: str | Path,
          overall: str | None = None, ranking: dict | None = None) -> dict:
    """The document of a run from its run row, configuration and summary rows (those carrying a verdict).

    overall: the run's verdict as judged (several candidates: the policy in e2eprof.candidates); None: the worst.
    """
    several = cand.is_multi(config)
    judged = [AA_ARM] if config.aa else cand.arm_names(config)
    verdicts = []
    for row in summary:
        if row.get("arm") not in judged or not isinstance(row.get("verdict"), str):
            continue
        reasons = row.get("reasons") or ""
        candidate = cand.label_of_arm(row["arm"]) if several else row["arm"]
        key = f"{row['point']}/{row['workload']}" if config.is_sweep else row["workload"]
        verdicts.append({
            "key": f"{candidate}/{key}" if several else key,
            "point": row.get("point"), "batch": _int(row.get("batch")), "seq": _int(row.get("seq")),
            "precision": row.get("precision"), "workload": row["workload"], "candidate": candidate,
            "verdict": row["verdict"], "reasons": [r for r in str(reasons).split(",") if r],
            "advice": row.get("advice") or "", "speedup": _number(row.get("speedup_vs_baseline")),
            "ci_low": _number(row.get("ci_low")), "ci_high": _number(row.get("ci_high")),
            "confidence": config.confidence, "n": _int(row.get("n")),
        })
    if overall is None:
        overall = worst([v["verdict"] for v in verdicts]) if verdicts else INCONCLUSIVE
    extra = {"candidates": ranking} if several and ranking is not None else {}
    return {
        "schema": SCHEMA, "version": VERSION,
        "run": {"run_id": run_row.get("run_id"), "status": run_row.get("status"), "model": config.model,
                "patch": config.patch, "device": config.device, "aa": config.aa,
                "command_line": run_row.get("command_line"), "run_dir": str(run_dir)},
        "policy": {"file": config.policy, "min_speedup": config.min_speedup, "confidence": config.confidence,
                   "correction": config.correction, "process_noise": config.process_noise,
                   "clock_tolerance": config.clock_tolerance, "temp_tolerance_c": config.temp_tolerance_c,
                   "target_ci": config.target_half_width},
        "verdict": overall, "exit_code": EXIT_CODES[overall], "verdicts": verdicts, **extra,
    }


def _int(value) -> int | None:
    number = _number(value)
    return int(number) if number is not None else None


def write(out_dir: Path, run_row: dict, config: CompareConfig, summary: list[dict], overall: str | None = None,
          ranking: dict | None = None) -> Path:
    """RUN_DIR/verdict.json for this run's summary."""
    path = Path(out_dir) / FILE
    document = build(run_row, config, summary, out_dir, overall, ranking)
    temporary = path.with_name("." + FILE + ".tmp")
    temporary.write_text(json.dumps(document, indent=2) + "\n")
    temporary.replace(path)  # a reader never sees half a file
    return path


def read(path: str | Path) -> dict:
    """A verdict.json document; ValueError when it is not one of this schema and version."""
    document = json.loads(Path(path).read_text())
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not an {SCHEMA} document")
    if document.get("version") != VERSION:
        raise ValueError(f"{path}: {SCHEMA} version {document.get('version')}, this e2eprof reads version {VERSION}")
    return document
