"""`e2eprof gate RUN_DIR`: re-judge a finished run under other thresholds, measuring nothing.

The verdicts come from analysis.judge, the function `compare` itself judged with, over the run's raw steps: a
changed confidence level or correction recomputes every interval and p-value from them. Refused (exit 2): a run
that is not complete, and any change that would need new measurements (workloads, steps, budget, replicas, ...).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from e2eprof.analysis.judge import Judgement, judge
from e2eprof.analysis.policy import POLICY_KEYS, load_policy
from e2eprof.analysis.summary import verdict_key
from e2eprof.config import CompareConfig
from e2eprof.errors import UsageError
from e2eprof.signoff import document as verdict_document
from e2eprof.tables.rundir import RunDir

# Thresholds a verdict is judged under; everything else a policy can set changes what is measured.
REJUDGEABLE = ("min_speedup", "confidence", "correction", "process_noise", "clock_tolerance", "temp_tolerance_c")


@dataclass
class Regated:
    """The run re-judged: its judgement, the document of it, and what changed against the recorded verdicts."""

    config: CompareConfig
    judgement: Judgement
    document: dict
    changed: list[str]

    @property
    def exit_code(self) -> int:
        return self.judgement.exit_code


def regate(run_dir: str | Path, policy: str | Path | None = None, **thresholds) -> Regated:
    """Re-judge run_dir: the recorded config, then the policy file, then thresholds given (None = not given)."""
    run = RunDir(run_dir)
    if not run.has("run"):
        raise UsageError(f"gate: {run_dir} holds no run.parquet; give a directory written by `e2eprof compare`")
    row = run.run_row()
    # No status at all: an e2eprof from before runs recorded one, which wrote run.parquet only at the end.
    if row.get("status") not in ("complete", None):
        raise UsageError(f"gate: the run in {run_dir} is {row.get('status')}, not complete; finish it with "
                         f"`e2eprof compare --resume --out {run_dir}` first")
    # correctness.parquet too: judged without it, every candidate would read as wrong and never run (a report folder
    # trimmed to its steps and summary keeps its recorded verdicts, not the evidence to judge them again).
    missing = [f"{name}.parquet" for name in ("steps", "summary", "correctness") if not run.has(name)]
    if missing:
        raise UsageError(f"gate: {run_dir} lacks {' and '.join(missing)}; it cannot be re-judged")
    recorded = CompareConfig.from_record(json.loads(row["config_json"]))
    changes = load_policy(policy) if policy is not None else {}
    for field, value in changes.items():
        key = next(k for k, (f, _) in POLICY_KEYS.items() if f == field)
        if field not in REJUDGEABLE and value != getattr(recorded, field):
            raise UsageError(f"gate: '{key}' in {policy} is {value!r}, the run measured with "
                             f"{getattr(recorded, field)!r}; that needs new measurements (`e2eprof compare`), "
                             f"gate can change only {', '.join(REJUDGEABLE)}")
    changes.update({k: v for k, v in thresholds.items() if v is not None})
    _check_thresholds(changes)
    config = _with(recorded, changes, policy)
    judgement = judge(run, config)
    points = {p.id: p for p in config.points}
    before = {verdict_key(config, points[r["point"]] if "point" in r else config.points[0], r["workload"], r["arm"]):
              r["verdict"] for r in run.read("summary").to_dict("records") if isinstance(r.get("verdict"), str)}
    changed = [f"{key}: {before.get(key, 'none')} -> {v.verdict} ({','.join(v.reasons)})"
               for key, v in judgement.verdicts.items() if before.get(key) != v.verdict]
    document = verdict_document.build(row, config, judgement.summary, run.path, judgement.overall, judgement.ranking)
    return Regated(config, judgement, document, changed)


def _check_thresholds(changes: dict) -> None:
    """The new thresholds through CompareConfig's own checks (errors name the option)."""
    unknown = set(changes) - set(REJUDGEABLE)
    if unknown:
        raise UsageError(f"gate: cannot change {', '.join(sorted(unknown))} without measuring again")
    CompareConfig(model="check", patch="check", device="cpu", **changes)


def _with(config: CompareConfig, changes: dict, policy) -> CompareConfig:
    """config with the new thresholds, not validated again as a whole (its device may not be on this machine)."""
    record = config.to_record() | changes
    if policy is not None:
        record["policy"] = str(policy)
    return CompareConfig.from_record(record)
