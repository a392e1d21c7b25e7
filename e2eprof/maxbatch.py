"""`compare --find-max-batch`: the largest batch each arm runs without running out of memory.

A kernel that saves memory (a fused backward that keeps fewer activations) can let a larger batch fit, which may be
worth more than its speed. Per arm and per (seq, precision) of the config: one worker process, probes of one train
step and one infer step at growing batch sizes (doubling, then a binary search; see sweep.search_max_batch), capped
by --max-batch. Arms are searched one after another, each in its own process, because arms on one device would
otherwise hold each other's cached allocator memory and the answer would depend on the order they ran in.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from e2eprof.tables import reports
from e2eprof.harness.arm_process import ArmFailed, ArmProcess
from e2eprof.config import CompareConfig
from e2eprof.errors import UsageError
from e2eprof.runner import (
    Events,
    _quiet,
    check_before_measuring,
    new_run_row,
    prepare_out_dir,
    recording_status,
)
from e2eprof.harness.arm_plan import planned_arms
from e2eprof.sweep import is_oom, search_max_batch
from e2eprof.harness.protocol import Build, Probe, WorkerSetup

PROBED_WORKLOADS = ("train", "infer")  # generate holds less than a train step and about what infer holds


@dataclass
class MaxBatchResult:
    run_dir: Path
    table: pd.DataFrame  # maxbatch.parquet: one row per (seq, precision, arm)


def find_max_batch(config: CompareConfig, events: Events = _quiet) -> MaxBatchResult:
    """Search every arm's largest batch at each (seq, precision) of the config; write run.parquet and maxbatch.parquet."""
    workloads = [w for w in config.workloads if w in PROBED_WORKLOADS]
    if not workloads:
        raise UsageError("--find-max-batch: probes train and infer steps; --workload names neither")
    loaded, attn = check_before_measuring(config, workloads)
    shapes = list(dict.fromkeys((p.seq, p.precision) for p in config.points))  # the batch list, if any, is not used
    out_dir = prepare_out_dir(config)
    events("start", config=config, run_dir=out_dir)
    run_row = new_run_row(config, loaded, mode="find-max-batch")
    reports.write_table(out_dir, "run", [run_row])
    rows: list[dict] = []
    try:
        with recording_status(run_row):
            for seq, precision in shapes:
                for arm in planned_arms(config, attn):
                    events("phase", name=f"max batch: {arm.name}", detail=f"seq {seq}, {precision}, up to {config.max_batch}")
                    rows.append(_search_arm(config, arm, seq, precision, workloads) | {"run_id": run_row["run_id"]})
                    reports.write_table(out_dir, "maxbatch", rows)
    finally:
        reports.write_table(out_dir, "run", [run_row])
    return MaxBatchResult(out_dir, pd.DataFrame(rows))


def _search_arm(config: CompareConfig, arm, seq: int, precision: str, workloads: list[str]) -> dict:
    """One arm's search in its own worker process; a failure that is not out-of-memory is reported, not searched past."""
    started = time.perf_counter()
    probes: list[dict] = []
    row = {"seq": seq, "precision": precision, "arm": arm.name, "workloads": ",".join(workloads),
           "max_batch_cap": config.max_batch}
    process = ArmProcess(WorkerSetup(arm=arm, model=config.model, patch_spec=config.patch, device=config.device,
                                     precision=precision, seed=config.seed, batch=1, seq=seq,
                                     new_tokens=config.new_tokens, scratch_dir=""))

    def fits(batch: int) -> bool:
        result = process.call(Probe(batch, list(workloads)))
        probes.append(result)
        return result["fits"]

    try:
        process.call(Build())
        best, _ = search_max_batch(fits, config.max_batch)
        failed = [p["batch"] for p in probes if not p["fits"]]
        row |= {"max_batch": best, "capped": best == config.max_batch, "smallest_failed": min(failed) if failed else None,
                "detail": next((p["detail"] for p in probes if not p["fits"]), "every probe fit")}
    except ArmFailed as failure:
        # Out of memory while building: the model itself does not fit, so no batch does.
        row |= {"max_batch": 0 if is_oom(failure) else None, "capped": False, "smallest_failed": None,
                "detail": str(failure)}
    finally:
        process.close()
    fitted = [p for p in probes if p["fits"]]
    best_probe = max(fitted, key=lambda p: p["batch"]) if fitted else {}
    return row | {"probes": len(probes), "probes_json": reports.to_json([(p["batch"], p["fits"]) for p in probes]),
                  "peak_alloc_mb_at_max": best_probe.get("peak_alloc_mb", float("nan")),
                  "search_s": time.perf_counter() - started}


def print_max_batch(console: Console, result: MaxBatchResult) -> None:
    """One table: per (seq, dtype) and arm, the largest batch that fit and how it was found."""
    table = Table(title="largest batch without running out of memory", title_justify="left")
    for column in ("seq", "dtype", "arm", "max batch", "first failure", "probes", "peak alloc MB"):
        table.add_column(column, justify="left" if column in ("dtype", "arm") else "right")
    for r in result.table.itertuples():
        best = "-" if pd.isna(r.max_batch) else f"{int(r.max_batch)}" + (" (cap)" if r.capped else "")
        first = "-" if pd.isna(r.smallest_failed) else str(int(r.smallest_failed))
        peak = "-" if pd.isna(r.peak_alloc_mb_at_max) else f"{r.peak_alloc_mb_at_max:.0f}"
        table.add_row(str(r.seq), r.precision, r.arm, best, first, str(r.probes), peak)
    console.print(table)
    for (seq, precision), rows in result.table.groupby(["seq", "precision"], sort=False):
        by_arm = dict(zip(rows.arm, rows.max_batch))
        base, patched = by_arm.get("baseline"), by_arm.get("patched")
        if base and patched and not pd.isna(base) and not pd.isna(patched) and base != patched:
            console.print(f"  seq {seq} {precision}: patched fits batch {int(patched)}, baseline {int(base)} "
                          f"({patched / base:.2f}x)")
    console.print(f"report: {result.run_dir}")
