"""`compare`: orchestrate the arms of one comparison and write its report tables as the run goes.

Per workload: a cold first step in every arm, the correctness gate on pristine weights (fp64 reference from
the baseline, op-level checks in the patched arm), warm-up until the median levels off, then timed blocks in
alternating order (A B C, C B A, ...) so drift and heating do not favour one arm.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from e2eprof import candidates as cand
from e2eprof import startup
from e2eprof.tables import reports
from e2eprof.harness import compile_cache, isolation
from e2eprof.harness.arm_plan import planned_arms, with_replicas
from e2eprof.harness import prestart
from e2eprof.harness.prestart import Prestarted
from e2eprof.harness import scratch as scratch_folder
from e2eprof.harness import worker_output
from e2eprof.analysis.judge import judge, write_judgement
from e2eprof.signoff import document as verdict_document
from e2eprof import resume as resume_run
from e2eprof.harness.arm_process import ArmProcess
from e2eprof.config import DEFAULT_WORKLOADS, CompareConfig, check_torch_device, default_out_dir
from e2eprof.distributed.launch import start_arm
from e2eprof.distributed.telemetry import open_rank_samplers
from e2eprof.env import capture_environment
from e2eprof.errors import RunError, UsageError
from e2eprof.harness.pool import broadcast
from e2eprof.harness.state import Events, RunState
from e2eprof.harness.unit import Unit
from e2eprof.patching.scope import check_device, fit_workloads
from e2eprof.phases.gate import correctness_gate, diagnose_failure, revalidate, trained_like_check
from e2eprof.phases.profile import profile_arms, profile_steps_for
from e2eprof.phases.proof import kernel_ran_rows, thread_rows
from e2eprof.phases.timing import timed_blocks
from e2eprof.registry import LoadedPatch
from e2eprof.sweep import SweepPoint, is_oom
from e2eprof.analysis.verdict import EXIT_CODES, Verdict
from e2eprof.harness.protocol import (ArmSpec, Build, Cold, Counters, EndWorkload, JitCounts, MemoryPeaks, Warmup,
                                      WorkerSetup, is_replica)
from e2eprof.workloads.loops import check_workloads
from e2eprof.workloads.models import ModelLoadError, resolve_model



def _quiet(kind: str, **info) -> None:
    pass


@dataclass
class Report:
    """What `compare` returns: where the tables are, the per-workload verdicts, and the exit code.

    `verdicts` is keyed by workload; in a sweep by "<point>/<workload>" (e.g. "b8-s1024-bf16/train").
    """

    run_dir: Path
    run_id: str
    summary: pd.DataFrame
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    overall: str = "INCONCLUSIVE"
    status: str = "complete"
    nothing_to_do: bool = False  # --resume of a run that was already complete

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.overall]


def prepare_out_dir(config: CompareConfig) -> Path:
    """The run directory; refuses to mix a new run into an old one unless --force."""
    out = config.out or default_out_dir(config.model, config.patch, dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ"))
    out = Path(out)
    try:
        if out.exists() and not out.is_dir():
            raise UsageError(f"--out: {out} exists and is not a directory")
        if out.exists() and any(out.iterdir()):
            if not config.force:
                raise UsageError(f"--out: {out} already holds a report ({run_progress(out)}); use --force to overwrite it")
            for old in out.glob("*.parquet"):
                old.unlink()
        out.mkdir(parents=True, exist_ok=True)
        reports.check_writable(out)
    except OSError as exc:
        raise UsageError(f"--out: cannot write reports to {out}: {exc.strerror or exc}") from None
    return out


def run_progress(out: Path) -> str:
    """'run abc123 interrupted; timed: train; not timed: infer' for a report directory, read from its tables."""
    try:
        run = reports.read_table(out, "run").iloc[0]
    except Exception:  # no run.parquet, or not ours: say so rather than fail on it
        return "no readable run.parquet"
    workloads = list(json.loads(run.config_json).get("workloads", [])) if isinstance(run.config_json, str) else []
    try:
        phases = reports.read_table(out, "phases")
        timed = [w for w in workloads if ((phases.workload == w) & (phases.phase == "timing")).any()]
    except Exception:
        timed = []
    text = f"run {run.run_id} {run.status}"
    if workloads:
        text += f"; timed: {', '.join(timed) or 'none'}; not timed: {', '.join(w for w in workloads if w not in timed) or 'none'}"
    return text


def check_before_measuring(config: CompareConfig, workloads) -> tuple[LoadedPatch, str]:
    """Everything that can be refused before a single measurement: the model, the workloads at every sequence length
    (generate on an encoder, --seq past the position table), the patch and whether it fits the model.
    Returns the loaded patch and the attention implementation the arms run with."""
    check_torch_device(config.device)  # the config may have taken it from NVML alone
    try:
        source = resolve_model(config.model)
    except ModelLoadError as exc:
        raise UsageError(f"--model: {exc}") from None
    try:
        for seq in sorted({p.seq for p in config.points}):
            check_workloads(source, workloads, seq)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    each, attn = cand.load_all(config, source.architecture)  # one per --patch, each checked against the model
    for one in each:
        check_device(one.patch, config.device)
    if len(each) == 1:
        return each[0], attn
    # Several: run.parquet's origin and source hash cover every candidate (--resume refuses when any changed).
    return cand.LoadedStack(each[0].patch, config.patch, ",".join(l.origin for l in each),
                            ",".join(l.source_hash for l in each), tuple(each)), attn


def new_run_row(config: CompareConfig, loaded: LoadedPatch, **extra) -> dict:
    """run.parquet's row as a run starts: what was asked for, on what, with which patch source; status "running"."""
    return {
        "run_id": uuid.uuid4().hex[:12], "schema_version": reports.SCHEMA_VERSION, "status": "running",
        "command_line": config.command_line, "config_json": reports.to_json(config.to_record()),
        "environment_json": reports.to_json(capture_environment(config.device)), "patch_spec": config.patch,
        "patch_origin": loaded.origin, "patch_source_sha256": loaded.source_hash, "seed": config.seed,
        "batch_digest": None, "started_unix_ns": time.time_ns(), "ended_unix_ns": None, "failure": None,
        **compile_cache.describe(), **extra,
    }


@contextmanager
def recording_status(run_row: dict) -> Iterator[None]:
    """Mark the run complete, interrupted (Ctrl-C, SIGTERM) or failed (with the error), and stamp its end time."""
    try:
        yield
        run_row["status"] = "complete"
    except KeyboardInterrupt:
        run_row["status"] = "interrupted"
        raise
    except BaseException as exc:
        run_row["status"] = "failed"
        run_row["failure"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        run_row["ended_unix_ns"] = time.time_ns()


def compare(config: CompareConfig, events: Events = _quiet, *, resume: bool = False,
            prestarted: Prestarted | None = None) -> Report:
    """Run one comparison (see module docstring) and return its Report. Raises UsageError before measuring.

    resume: continue the interrupted run in config.out (resume.py): its finished units are kept, the others run;
    a complete run is returned as it is (Report.nothing_to_do).
    prestarted: the first point's processes, started by the caller before its own imports (the command line does);
    otherwise they are started here when the machine has cores for them. Stopped when the run ends, used or not.
    """
    if config.find_max_batch:
        if prestarted is not None:
            prestarted.close()
        raise UsageError("find_max_batch: this searches batch sizes instead of comparing; call e2eprof.maxbatch.find_max_batch")
    if prestarted is None:
        prestarted = prestart.for_config(config)
    try:
        return _compare(config, events, resume, prestarted)
    finally:
        if prestarted is not None:
            prestarted.close()


def _compare(config: CompareConfig, events: Events, resume: bool, prestarted: Prestarted | None) -> Report:
    loaded, attn = check_before_measuring(config, config.workloads)
    workloads, notes = config.workloads, []
    for one in getattr(loaded, "loaded", ()) or (loaded,):  # every candidate runs on the same workloads
        workloads, note = fit_workloads(one.patch, workloads, defaulted=config.workloads == DEFAULT_WORKLOADS)
        notes += [note] if note else []
    if notes:
        config = replace(config, workloads=workloads)
        for note in notes:
            events("phase", name=note)
    prior = resume_run.load(config, loaded.source_hash) if resume else None
    if prior is not None and prior.complete:
        summary = reports.read_table(prior.out_dir, "summary")
        return Report(prior.out_dir, prior.run_row["run_id"], summary, {}, prior.run_row["verdict"], nothing_to_do=True)
    out_dir = prior.out_dir if prior is not None else prepare_out_dir(config)
    events("start", config=config, run_dir=out_dir)

    if prior is not None:
        run_row = resume_run.restart_row(prior, reports.to_json(capture_environment(config.device)))
    else:
        run_row = new_run_row(config, loaded, model_json=None)
    run_id = run_row["run_id"]
    # In the parent (sampling never runs inside a timed step), one sampler per rank's GPU.
    sampler = open_rank_samplers(config.device, config.nproc if config.launch else 1)
    run_row["telemetry_available"] = sampler.available
    run_row["telemetry_unavailable_reason"] = sampler.unavailable_reason
    if sampler.available:
        sampler.start()
    else:
        events("phase", name="telemetry unavailable", detail=sampler.unavailable_reason)
    state = RunState(out_dir, run_row, sampler)
    entered = startup.take_entry()
    if entered is not None:  # interpreter, imports and the checks above: paid before any worker starts
        state.record_phase("*", "start-up and checks", entered)
    if prior is not None:
        state.prior, state.units = prior.tables, prior.units
        for key, unit in prior.units.items():  # what the summary and the explanation need of the kept units
            point_id, workload = key.split("/")
            point = next(p for p in config.points if p.id == point_id)
            if unit["timing"]:
                state.timing[(point_id, workload)] = unit["timing"]
            for arm, profile in unit["profiles"].items():
                state.profiles[(point, workload, arm)] = profile
        events("phase", name="resume", detail=f"{len(prior.units)} finished unit(s) kept: {', '.join(sorted(prior.units)) or 'none'}")
    state.flush()
    arms = planned_arms(config, attn)
    scratch, orphans = scratch_folder.create()
    if orphans:
        events("phase", name="scratch", detail=f"removed {len(orphans)} scratch folder(s) of killed runs: "
                                               f"{', '.join(str(p) for p in orphans)}")
    run_row["points_json"] = reports.to_json([p.columns() for p in config.points])
    try:
        with recording_status(run_row):
            for index, point in enumerate(config.points):
                if config.is_sweep:
                    events("point", point=point, index=index, total=len(config.points))
                _run_point(config.at(point), point, arms, state, cand.patches_by_arm(config, loaded), scratch, events,
                           prestarted if index == 0 else None)
            if config.microbench:
                for point in config.points:
                    with state.phase(events, "*", f"microbench {point.id}"):
                        _microbench_phase(config.at(point), point, state)
            sampler.stop()
            with state.phase(events, "*", "summary and tables"):
                # Judged from the tables just written, as `e2eprof gate` judges them: the same rows, the same verdicts.
                state.flush()
                judgement = judge(out_dir, config)
                write_judgement(out_dir, judgement, run_id)
                summary, verdicts = judgement.summary, judgement.verdicts
                run_row["verdict"] = judgement.overall
                if judgement.ranking is not None:
                    run_row["candidates_json"] = reports.to_json(judgement.ranking)
        # After the block, so the document's run status reads complete, as run.parquet's does.
        verdict_document.write(out_dir, run_row, config, summary, judgement.overall, judgement.ranking)
    finally:
        sampler.stop()
        state.flush()
        scratch_folder.remove(scratch)
    overall = run_row["verdict"]
    return Report(out_dir, run_id, pd.DataFrame(summary), verdicts, overall)


def _microbench_phase(config: CompareConfig, point, state: RunState) -> None:
    """`e2eprof microbench` at this point's shapes, in a fresh process after every arm has closed.

    A fresh process because the microbenchmark must see the stock op (no patch applied anywhere) and must not share
    an allocator or a compile cache with the arms. Its table lands in microbench/<point>/microbench.parquet; a failure
    is recorded as a row and the run goes on (the loop results are already measured).
    """
    out = state.out_dir / "microbench" / point.id
    command = [sys.executable, "-m", "e2eprof", "microbench", "--patch", config.patch, "--model", config.model,
               "--device", config.device, "--batch", str(config.batch), "--seq", str(config.seq),
               "--dtype", config.precision, "--no-sweep", "--seed", str(config.seed), "--out", str(out), "--force"]
    result = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ))
    passed = result.returncode == 0
    state.correctness.append({
        "workload": "*", "arm": "patched", "tensor": "-", "metric": "microbench_ran", "value": float(passed),
        "tolerance": 1.0, "passed": True,  # informational: the verdict rests on the loop, not the microbenchmark
        "detail": (f"microbench/{point.id}/microbench.parquet" if passed
                   else f"exit {result.returncode}: {(result.stderr.strip().splitlines() or ['no output'])[-1]}")})


def _run_point(config: CompareConfig, point: SweepPoint, arms: list[ArmSpec], state: RunState, patch, scratch: Path,
               events: Events, prestarted: Prestarted | None = None) -> None:
    """Every workload at one point, in fresh worker processes (config holds this point's batch, seq and precision).

    Fresh workers per point, not one set reshaped between points: a process's peak RSS, its allocator's cached
    blocks and torch.compile's shape specialisations (a recompile turns dynamic shapes on) would otherwise carry
    from one point into the next, and an out-of-memory point could leave the next one a fragmented heap.
    """
    state.begin_point(point)
    todo = [w for w in config.workloads if resume_run.unit_key(point.id, w) not in state.units]
    if not todo:  # every unit of this point was finished by an earlier attempt (--resume)
        if prestarted is not None:
            prestarted.close()  # not needed here, and the next point starts its own
        state.end_point()
        return
    processes: dict[str, ArmProcess] = {}  # by process key: the arm's name, "<arm>#<replica>" for its replicas
    try:
        specs = with_replicas(config, arms)
        placements = isolation.plan(len(specs), config.isolate) if config.launch is None else [None] * len(specs)
        asked = {arm.key: placement.describe() for arm, placement in zip(specs, placements) if placement is not None}
        with state.phase(events, "*", "start workers and build models", ", ".join(a.key for a in specs)):
            for index, (arm, placement) in enumerate(zip(specs, placements)):
                processes[arm.key] = start_arm(WorkerSetup(
                    arm=arm, model=config.model, patch_spec=cand.spec_of_arm(config, arm.name), device=config.device,
                    precision=config.precision, seed=config.seed, batch=config.batch, seq=config.seq,
                    new_tokens=config.new_tokens, scratch_dir=str(scratch),
                    placement=placement or isolation.Placement()), config.launch, index,
                    prestarted.take() if prestarted is not None else None)
            if prestarted is not None:
                prestarted.close()  # any spare now, before anything is timed
            builds = broadcast(processes, state, Build())
        if "baseline" not in builds:
            failure = state.arm_failures["baseline"]
            if is_oom(failure):
                return  # recorded; the summary says OUT_OF_MEMORY for this point and the sweep goes on
            raise RunError(f"the baseline arm could not start: {failure}")
        # What each process asked for and what took effect (the OS may refuse cores, a user's OMP_* setting wins).
        state.run_row["isolation_json"] = reports.to_json(
            {key: {"asked": asked.get(key), **builds[key].get("placement", {})} for key in builds})
        if state.run_row.get("model_json") is None:
            state.run_row["model_json"] = reports.to_json(builds["baseline"]["model"])
            state.run_row["batch_digest"] = builds["baseline"].get("batch_digest")
            state.run_row["sites_json"] = reports.to_json(cand.sites(config, builds))
            # Data-parallel arms: each rank's pid, device and GPU UUID (single-process builds have no "ranks").
            state.run_row["ranks_json"] = reports.to_json({a: b["ranks"] for a, b in builds.items() if "ranks" in b})
            # The start-up's critical path: when each worker started and how far its imports and build had got.
            state.run_row["startup_json"] = reports.to_json(
                {key: {"started_unix_ns": b.get("started_unix_ns"), **(b.get("process_age_s") or {}),
                       "build_s": b.get("build_s")} for key, b in builds.items()})
        events("built", builds=builds)
        for workload in todo:
            _run_workload(Unit(config, workload, processes, state, next(iter(patch.values())), scratch, events, patch))
            # Peaks per unit, so a finished unit's rows are complete when it is recorded as finished. An arm's
            # replicas hold the same model and batches: its first process speaks for its memory.
            firsts = {k: p for k, p in processes.items() if not is_replica(k)}
            for rows in broadcast(firsts, state, MemoryPeaks()).values():
                state.memory += [r for r in rows if r["workload"] == workload]
            for rows in broadcast(processes, state, JitCounts()).values():  # every process: all of them were timed
                state.jit += [r for r in rows if r["workload"] == workload]
            broadcast(processes, state, EndWorkload(workload))
            state.finish_unit(workload)
            state.flush()
    finally:
        # All at once: each worker's exit (CUDA context, torch.compile's worker pool) then overlaps the others'.
        with state.phase(events, "*", "stop workers"):
            for process in processes.values():
                process.request_close()
            for process in processes.values():
                process.close()
            worker_output.drain()  # their last lines come before anything the parent prints next
        state.end_point()
        state.flush()


def _run_workload(unit: Unit) -> None:
    """One (point, workload): cold step, correctness gate, warm-up, timed blocks, proof the patch ran, revalidation,
    profile; each phase's rows are recorded in the run's state as it finishes."""
    config, workload, state = unit.config, unit.workload, unit.state
    before = {a: unit.call(a, Counters()) for a in unit.first()}
    first_step = len(state.steps)  # this workload's steps are state.steps[first_step:]
    broken_before = [a for a in unit.candidates if a in unit.live()]

    with unit.phase("cold step"):
        for arm in unit.live():
            state.steps += unit.call(arm, Cold(workload)) or []

    with unit.phase("correctness"), correctness_gate(unit):  # the compile arm's capture runs on inside the block
        for arm in broken_before:
            if arm not in unit.live():  # failed in its cold step or in the gate's capture
                diagnose_failure(unit, arm)
        trained_like_check(unit)

    with unit.phase("warm-up"):
        for arm in unit.live():
            state.steps += unit.call(arm, Warmup(workload, window=max(config.block_steps, 3),
                                                 tolerance=config.warmup_tolerance, max_steps=config.max_warmup_steps,
                                                 max_seconds=config.max_warmup_seconds)) or []

    with unit.phase("timing"):
        timed_blocks(unit)

    after = {a: unit.call(a, Counters()) for a in unit.first()}
    state.correctness += kernel_ran_rows(workload, before, after)
    state.correctness += thread_rows(workload, state.steps[first_step:])
    with unit.phase("revalidation"):
        revalidate(unit)
    state.flush()

    if config.profile:
        with unit.phase("profile", "{} warm-up + {} active steps per arm".format(*profile_steps_for(config, workload))):
            profile_arms(unit)


