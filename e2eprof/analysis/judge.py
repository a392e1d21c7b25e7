"""The end of a run: its verdicts, summary, arm balance and op-level explanation, judged from its written tables.

`compare` flushes its tables and then calls `judge` on the run directory; `e2eprof gate` calls the same function on a
finished run with other thresholds. Both read the same rows through the same statistics, so an unchanged policy
gives the same verdicts bit for bit. Everything judged comes from the run's own tables (steps, correctness, jit,
memory, ops, kernels) and run.parquet (the finished units' timing and profile totals in resume_json).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pandas as pd

from e2eprof import candidates as cand
from e2eprof import resume as resume_run
from e2eprof.analysis import explain
from e2eprof.analysis.summary import attach_memory, summarize, verdict_key
from e2eprof.analysis.verdict import EXIT_CODES, Verdict, flag_implausible
from e2eprof.config import CompareConfig
from e2eprof.distributed import ranks as dp
from e2eprof.sweep import by_point
from e2eprof.tables import reports
from e2eprof.tables.rundir import RunDir
from e2eprof.trackers import telemetry


@dataclass
class Judgement:
    """What a run's tables say under one configuration's thresholds (nothing is written)."""

    summary: list[dict]
    verdicts: dict[str, Verdict]
    overall: str
    balance: list[dict] = field(default_factory=list)
    opdiff: pd.DataFrame | None = None
    explain: list[dict] = field(default_factory=list)
    pairwise: list[dict] = field(default_factory=list)  # several candidates: each pair's interval
    ranking: dict | None = None  # several candidates: candidates.rank's result

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.overall]


def judge(run_dir: str | Path | RunDir, config: CompareConfig) -> Judgement:
    """Summary rows per (point, workload, arm) and a verdict per (point, workload) from the tables in run_dir."""
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    row = run.run_row()
    steps = _rows(run, "steps")
    correctness = _rows(run, "correctness")
    units = json.loads(row["resume_json"]) if isinstance(row.get("resume_json"), str) else {}
    timing, profiles = _units(run.path, units, config)
    steps_frame = pd.DataFrame(steps)
    balance = (by_point(steps_frame, lambda s: telemetry.arm_balance(
        s, clock_tolerance=config.clock_tolerance, temp_tolerance_c=config.temp_tolerance_c)).to_dict("records")
        if bool(row.get("telemetry_available")) and len(steps_frame) else [])
    pairwise: list[dict] = []
    summary, verdicts = summarize(steps, correctness, config, _failed_by_point(correctness, config), balance, timing,
                                  jit=_rows(run, "jit"), pairwise=pairwise)
    opdiff, explained = _explain_into(summary, profiles)
    dp.attach_rank_columns(summary, steps, profiles)
    _flag_implausible(summary, verdicts, config)
    attach_memory(summary, _rows(run, "memory"))
    overall = cand.run_verdict(config, verdicts)  # one candidate: worst over (point, workload)
    ranking = cand.rank(summary, pairwise, config) if cand.is_multi(config) else None
    return Judgement(summary, verdicts, overall, balance, opdiff, explained, pairwise, ranking)


def _rows(run: RunDir, name: str) -> list[dict]:
    frame = run.read_if_present(name)
    if frame is None or not len(frame):
        return []
    return frame.drop(columns=["run_id"], errors="ignore").to_dict("records")


def _failed_by_point(correctness: list[dict], config: CompareConfig) -> dict[str, set[str]]:
    """Arms that failed at each point (pool.record_failure writes arm_failed; running out of memory is not one)."""
    failed: dict[str, set[str]] = {p.id: set() for p in config.points}
    for check in correctness:
        if check.get("metric") == "arm_failed":
            failed.setdefault(check.get("point", config.points[0].id), set()).add(check["arm"])
    return failed


def _units(out: Path, units: dict[str, dict], config: CompareConfig) -> tuple[dict, dict]:
    """Timing (why it stopped) per (point id, workload) and profiles per (point, workload, arm) of finished units."""
    resume_run.read_back_profile_rows(out, units)  # their per-op and per-kernel rows, from ops and kernels.parquet
    points = {p.id: p for p in config.points}
    timing, profiles = {}, {}
    for key, unit in units.items():
        point_id, workload = key.split("/")
        if unit.get("timing"):
            timing[(point_id, workload)] = unit["timing"]
        for arm, profile in unit.get("profiles", {}).items():
            profiles[(points[point_id], workload, arm)] = profile
    return timing, profiles


def _ops_frame(profiles: dict) -> pd.DataFrame:
    return pd.concat([explain.ops_frame(result, workload=w, arm=a).assign(rank=rank, **p.columns())
                      for (p, w, a), r in profiles.items() for rank, result in dp.by_rank(r)], ignore_index=True)


def _explain_into(summary: list[dict], profiles: dict) -> tuple[pd.DataFrame | None, list[dict]]:
    """Op diff and Amdahl explanation per workload from the profiles; adds prediction columns to the summary."""
    if not profiles:
        return None, []
    ops = _ops_frame(profiles)
    # Arms are compared op by op on rank 0 (every rank runs the same ops on its own shard). Several candidates: each
    # candidate's arm against the baseline, its rows named by the candidate (an arm "patched" would match none).
    rank0 = ops[ops["rank"] == 0]
    candidates = sorted({a for a in rank0["arm"] if a.startswith(cand.PREFIX)})
    if candidates:
        parts = [by_point(rank0, partial(explain.op_diff, patched=arm)).assign(candidate=arm.removeprefix(cand.PREFIX))
                 for arm in candidates]
        opdiff = pd.concat(parts, ignore_index=True)
    else:
        opdiff = by_point(rank0, explain.op_diff)
    points = {p.id: p for p, _, _ in profiles}
    rows = []
    for row in summary:
        point = points.get(row.get("point"))
        profile = profiles.get((point, row["workload"], row["arm"]))
        if profile:
            row["profile_device_ms"] = profile["total_device_us"] / 1e3
            row["idle_share"] = profile["idle_share"]
            row["replaced_ms"] = profile["replaced_device_us"] / 1e3 if profile["device_type"] == "cuda" else profile["replaced_cpu_us"] / 1e3
        base = profiles.get((point, row["workload"], "baseline"))
        # Several candidates: no Amdahl explanation. The baseline marks one patch's replaced region in its profile,
        # so f is not each candidate's (an f of 0 would call every gain implausible).
        if row["arm"] != "patched" or not profile or not base:
            continue
        result = explain.explain(row["workload"], base, profile, row.get("speedup_vs_baseline", math.nan),
                                 measured_low=row.get("ci_low", math.nan))
        rows.append({**point.columns(), "workload": row["workload"],
                     **{k: v for k, v in result.items() if not isinstance(v, (list, dict))},
                     "grown_ops": reports.to_json(result.get("grown_ops"))})
        row.update(replaced_share=result["f"], replaced_speedup=result["s"], predicted_speedup=result["predicted"],
                   amdahl_bound=result["bound"], cause=result["cause"], cause_detail=result["detail"])
    return opdiff, rows


def _flag_implausible(summary: list[dict], verdicts: dict, config: CompareConfig) -> None:
    """A step gain beyond the Amdahl bound (explain's cause "implausible") reaches the verdict as IMPLAUSIBLE_GAIN."""
    points = {p.id: p for p in config.points}
    for row in summary:
        if row.get("cause") != "implausible" or row.get("verdict") is None:
            continue
        key = verdict_key(config, points[row["point"]], row["workload"], row["arm"])
        sure = row["ci_low"] if math.isfinite(row.get("ci_low", math.nan)) else row["speedup_vs_baseline"]
        detail = (f"the step gained at least {sure:.3f}x, but the replaced region ({row['replaced_share']:.1%} of the "
                  f"baseline step) allows at most {row['amdahl_bound']:.3f}x: work skipped or moved off the clock, "
                  f"or the profile's range misses calls")
        verdicts[key] = flag_implausible(verdicts[key], detail)
        row.update(verdict=verdicts[key].verdict, reasons=",".join(verdicts[key].reasons), advice=verdicts[key].advice)


def write_judgement(out_dir: Path, judgement: Judgement, run_id: str) -> None:
    """The judged tables of a run: balance, opdiff, explain, pairwise and summary (compare writes them; gate does not)."""
    if judgement.balance:
        reports.write_table(out_dir, "balance", [r | {"run_id": run_id} for r in judgement.balance])
    if judgement.opdiff is not None:
        reports.write_table(out_dir, "opdiff", judgement.opdiff.assign(run_id=run_id))
    if judgement.explain:
        reports.write_table(out_dir, "explain", [r | {"run_id": run_id} for r in judgement.explain])
    if judgement.pairwise:
        reports.write_table(out_dir, "pairwise", [r | {"run_id": run_id} for r in judgement.pairwise])
    reports.write_table(out_dir, "summary", [r | {"run_id": run_id} for r in judgement.summary])
