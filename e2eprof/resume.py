"""`compare --resume`: continue an interrupted run in its own directory, with its own configuration.

A run is made of units, one per (sweep point, workload). When a unit has finished (timed, revalidated, profiled)
the runner records it in run.parquet's `resume_json` (with what the tables cannot hold: why timing stopped, the
profiles' totals), in the same flush that writes its rows. A profile's per-op and per-kernel rows are not copied
there: they are in ops.parquet and kernels.parquet already, and are read back from them on a resume. Resuming keeps the rows of every recorded unit exactly as
they are and discards everything else of the earlier attempt: a unit that was half measured is rerun from its
start in fresh worker processes, never pooled with the blocks of the process that was interrupted.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from e2eprof.tables import reports
from e2eprof.config import CompareConfig
from e2eprof.errors import UsageError
from e2eprof.tables.rundir import RunDir
from e2eprof.sweep import OOM_METRIC

# Options that may differ between the interrupted command and the resuming one: they do not change what is measured.
# workload_process_noise follows from the device and --process-noise, which are compared; a run recorded before it
# existed resumes under the floors of today's version.
IGNORED = {"out", "force", "command_line", "workload_process_noise"}
# Config field -> the option that sets it, for the refusal message.
OPTION = {"workloads": "--workload", "precision": "--dtype", "reference_arms": "--reference", "budget_seconds": "--budget",
          "target_half_width": "--target-ci", "replicas": "--replicas",
          "candidates": "--patch"}
# Tables whose rows belong to units (point and workload columns); the others are derived again at the end.
UNIT_TABLES = ("steps", "correctness", "phases", "memory", "jit")
# A profile's row lists, each written as its own table; resume_json holds the rest of the profile.
PROFILE_TABLES = ("ops", "kernels")
# Columns the runner adds to those rows when it writes the tables (the profile's own rows have none of them).
IDENTITY_COLUMNS = {"run_id", "workload", "arm", "rank", "point", "batch", "seq", "precision"}


def unit_key(point_id: str, workload: str) -> str:
    return f"{point_id}/{workload}"


@dataclass
class Prior:
    """What an earlier attempt of this run left: its run row, finished units and the rows to keep."""

    out_dir: Path
    run_row: dict
    units: dict[str, dict]  # unit_key -> {"timing": {...}, "profiles": {arm: ProfileResult dict}}
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return self.run_row["status"] == "complete"


def load(config: CompareConfig, patch_source_sha256: str | None) -> Prior:
    """Read the run in config.out and check it is this run; raise UsageError (exit 2) when it cannot be resumed."""
    if config.out is None or not RunDir(config.out).has("run"):
        raise UsageError("--resume needs --out pointing at an earlier run's report directory")
    if config.force:
        raise UsageError("--resume and --force exclude each other: --force starts over, --resume continues")
    out = Path(config.out)
    try:
        row = RunDir(out).run_row()
        recorded = json.loads(row["config_json"])
    except Exception as exc:  # not a run directory of ours: say so in one line
        raise UsageError(f"--resume: {out}/run.parquet is not readable as an e2eprof run ({type(exc).__name__})") from None
    if row.get("find_max_batch") or recorded.get("find_max_batch"):
        raise UsageError("--resume: a --find-max-batch run cannot be resumed; rerun it with --force")
    _check_same(out, recorded, json.loads(reports.to_json(config.to_record())))
    if patch_source_sha256 != row.get("patch_source_sha256"):
        raise UsageError(f"--resume: the patch source changed since the run in {out} started "
                         f"(sha256 {str(row.get('patch_source_sha256'))[:12]} -> {str(patch_source_sha256)[:12]}); "
                         f"use --force to start over")
    units = json.loads(row["resume_json"]) if isinstance(row.get("resume_json"), str) else {}
    prior = Prior(out, row, units)
    if not prior.complete:
        prior.tables = _kept_rows(out, config, units)
        read_back_profile_rows(out, units)
    return prior


def without_profile_rows(profile: dict) -> dict:
    """A profile (ProfileResult dict, or a data-parallel arm's with by_rank) without its ops and kernels rows."""
    slim = {k: v for k, v in profile.items() if k not in PROFILE_TABLES}
    if profile.get("by_rank"):
        slim["by_rank"] = [without_profile_rows(rank) for rank in profile["by_rank"]]
    return slim


def read_back_profile_rows(out: Path, units: dict[str, dict]) -> None:
    """Give the kept units' profiles their ops and kernels rows again, from the tables the earlier attempt wrote."""
    from e2eprof.distributed.ranks import by_rank

    run_dir = RunDir(out)
    tables = {name: run_dir.read(name) for name in PROFILE_TABLES if run_dir.has(name)}
    for key, unit in units.items():
        point_id, workload = key.split("/")
        for arm, profile in unit.get("profiles", {}).items():  # none in units written before profiles were kept
            for rank, result in by_rank(profile):
                for name in PROFILE_TABLES:
                    if name in result:  # written whole by an earlier e2eprof
                        continue
                    frame = tables.get(name)
                    if frame is None or frame.empty:
                        result[name] = []
                        continue
                    mine = frame[(frame["point"] == point_id) & (frame["workload"] == workload)
                                 & (frame["arm"] == arm) & (frame["rank"] == rank)]
                    own = [c for c in mine.columns if c not in IDENTITY_COLUMNS]
                    result[name] = mine[own].to_dict("records")


def _check_same(out: Path, recorded: dict, asked: dict) -> None:
    for key in sorted(set(recorded) | set(asked)):
        if key in IGNORED or recorded.get(key) == asked.get(key):
            continue
        option = OPTION.get(key, "--" + key.replace("_", "-"))
        raise UsageError(f"--resume: the run in {out} was started with {option} {_show(recorded.get(key))}, this "
                         f"command asks for {_show(asked.get(key))}; resume with the same options, or use --force to "
                         f"start over")


def _show(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def _kept_rows(out: Path, config: CompareConfig, units: dict[str, dict]) -> dict[str, pd.DataFrame]:
    """Rows of the finished units, as written; rows of a point's set-up ('*') only when all its units finished."""
    whole_points = {p.id for p in config.points if all(unit_key(p.id, w) in units for w in config.workloads)}
    kept = {}
    run_dir = RunDir(out)
    for name in (*UNIT_TABLES, "telemetry"):
        if not run_dir.has(name):
            continue
        frame = run_dir.read(name)
        if name == "telemetry":  # raw samples over time, not per unit: the kept steps were joined with them
            kept[name] = frame.drop(columns=["run_id"], errors="ignore")
            continue
        if "point" not in frame.columns:  # no row of any point was written
            continue
        keys = frame["point"].astype(str) + "/" + frame["workload"].astype(str)
        keep = keys.isin(set(units)) | ((frame["workload"] == "*") & frame["point"].isin(whole_points))
        if name == "correctness":
            # An arm that failed (or ran out of memory) outside a workload - building, or collecting memory peaks
            # after a unit finished - failed for the point's kept units too: keep its row, or their verdicts forget it.
            kept_points = {key.partition("/")[0] for key in units}
            keep |= ((frame["workload"] == "*") & frame["metric"].isin(["arm_failed", OOM_METRIC])
                     & frame["point"].isin(kept_points))
        # What runs after the last point (microbenchmarks, the summary) runs again, whatever got done of it.
        if name == "phases":
            keep &= ~(frame["phase"].astype(str).str.startswith("microbench") | (frame["phase"] == "summary and tables"))
        if name == "correctness":
            keep &= frame["metric"] != "microbench_ran"
        kept[name] = frame[keep].reset_index(drop=True)
    return kept


def restart_row(prior: Prior, environment_json: str) -> dict:
    """The run row, running again; each resume is recorded (when, from which status, units kept, its environment)."""
    row = dict(prior.run_row)
    history = json.loads(row["resumes_json"]) if isinstance(row.get("resumes_json"), str) else []
    history.append({"unix_ns": time.time_ns(), "from_status": row["status"], "units_kept": sorted(prior.units),
                    "environment_json": environment_json})
    row.update(status="running", ended_unix_ns=None, failure=None, resumes_json=reports.to_json(history))
    return row
