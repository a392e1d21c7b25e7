"""`compare`: orchestrate the arms of one comparison and write its report tables as the run goes.

Per workload: a cold first step in every arm, the correctness gate on pristine weights (fp64 reference from
the baseline, op-level checks in the patched arm), warm-up until the median levels off, then timed blocks in
alternating order (A B C, C B A, ...) so drift and heating do not favour one arm.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from e2eprof import explain, interrupt, isolation, reports, startup, stats, telemetry, worker_output
from e2eprof import resume as resume_run
from e2eprof.arm_process import ArmFailed, ArmProcess
from e2eprof.config import AA_ARM, DECODING_WORKLOADS, CompareConfig, default_out_dir
from e2eprof.correctness import compare_captures, op_check_rows
from e2eprof.distributed import ranks as dp
from e2eprof.distributed.launch import start_arm
from e2eprof.distributed.telemetry import RankSamplers, open_rank_samplers, per_rank
from e2eprof.env import capture_environment
from e2eprof.errors import RunError, UsageError
from e2eprof.patching import call_check_rows, check_model_fits
from e2eprof.registry import LoadedPatch, load_patch
from e2eprof.summary import attach_memory, summarize, summary_interval, verdict_key
from e2eprof.sweep import SweepPoint, by_point, is_oom, oom_row, stamp
from e2eprof.verdict import EXIT_CODES, Verdict, flag_implausible, worst
from e2eprof.worker import ArmSpec, WorkerSetup, arm_of, is_replica, scratch_path
from e2eprof.workloads.loops import check_workloads
from e2eprof.workloads.models import ModelLoadError, resolve_model

Events = Callable[..., None]


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


class _RunState:
    """Everything measured so far, flushed to Parquet after each phase so nothing is lost."""

    def __init__(self, out_dir: Path, run_row: dict, sampler: RankSamplers):
        self.out_dir = out_dir
        self.sampler = sampler
        self.run_row = run_row
        self.steps: list[dict] = []
        self.correctness: list[dict] = []
        self.arm_failures: dict[str, ArmFailed] = {}
        self.profiles: dict[tuple[SweepPoint, str, str], dict] = {}  # (point, workload, arm) -> ProfileResult.to_dict()
        self.phases: list[dict] = []  # where the run's own wall time went (issue: timing should dominate)
        self.timing: dict[tuple[str, str], dict] = {}  # (point id, workload) -> blocks run, why timing stopped, seconds
        self.memory: list[dict] = []  # peak device/host memory per (point, workload, arm, phase)
        self.jit: list[dict] = []  # just-in-time work per (point, workload, process, phase)
        # Workers are started afresh at every point, so arm_failures is per point; the past points' are kept here.
        self.point: SweepPoint | None = None
        self.failed_by_point: dict[str, set[str]] = {}
        self.out_of_memory: set[tuple[str, str]] = set()  # (arm, workload) that ran out of memory at this point
        self._stamped = {"steps": 0, "correctness": 0, "phases": 0, "memory": 0, "jit": 0}
        # --resume: rows of the units an earlier attempt finished, kept as written (resume.py), and those units
        # with what the tables cannot hold (why timing stopped, profiles), recorded in run.parquet's resume_json.
        self.prior: dict[str, pd.DataFrame] = {}
        self.units: dict[str, dict] = {}

    def begin_point(self, point: SweepPoint) -> None:
        self.point = point
        self.arm_failures = {}
        self.out_of_memory = set()

    def end_point(self) -> None:
        """Stamp this point's rows and keep which arms failed for real (running out of memory is not a failure)."""
        self._stamp()
        failed = {a for a, f in self.arm_failures.items() if not is_oom(f)}
        prior = self.prior.get("correctness")
        if prior is not None and len(prior):  # arms that failed in this point's units an earlier attempt finished
            mine = prior[(prior["point"] == self.point.id) & (prior["metric"] == "arm_failed")]
            failed |= set(mine["arm"])
        self.failed_by_point[self.point.id] = failed

    def _stamp(self) -> None:
        """Every row recorded since the last stamp was measured at the current point: give it the identity columns."""
        if self.point is not None:
            for name in self._stamped:
                self._stamped[name] = stamp(getattr(self, name), self.point, self._stamped[name])

    @contextmanager
    def phase(self, events: Events, workload: str, name: str, detail: str = "") -> Iterator[None]:
        """Announce a phase and record its wall time in phases.parquet, also when it fails."""
        events("phase", name=f"{workload}: {name}" if workload != "*" else name, detail=detail)
        start = time.time_ns()
        try:
            yield
        finally:
            self.record_phase(workload, name, start)

    def record_phase(self, workload: str, name: str, start_unix_ns: int) -> None:
        """A phases.parquet row for work from start_unix_ns until now."""
        end = time.time_ns()
        self.phases.append({"workload": workload, "phase": name, "start_unix_ns": start_unix_ns, "end_unix_ns": end,
                            "seconds": (end - start_unix_ns) / 1e9})

    def steps_frame(self) -> pd.DataFrame:
        """Steps joined with the telemetry samples that fall inside each step (clocks, temperature, throttling).

        Kept steps of an earlier attempt come first, as written (joined with that attempt's samples).
        """
        steps = pd.DataFrame(self.steps)
        samples = self.sampler.frame() if self.sampler.available else None
        if samples is not None and len(samples) and len(steps):
            steps = per_rank(telemetry.join_steps, steps, samples)
        return self._with_prior("steps", steps)

    def _with_prior(self, name: str, rows: list[dict] | pd.DataFrame) -> pd.DataFrame:
        frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
        prior = self.prior.get(name)
        if prior is None or not len(prior):
            return frame
        if not len(frame):
            return prior
        return pd.concat([prior, frame.assign(run_id=self.run_row["run_id"])], ignore_index=True)

    def all_rows(self, name: str) -> list[dict]:
        """Kept rows of an earlier attempt, then this attempt's (steps, correctness, memory), for the summary."""
        prior = self.prior.get(name)
        return (prior.to_dict("records") if prior is not None else []) + getattr(self, name)

    def samples_frame(self) -> pd.DataFrame:
        return self._with_prior("telemetry", self.sampler.frame())

    def finish_unit(self, workload: str) -> None:
        """This (point, workload) is done: recorded with its rows in the next flush, kept by a --resume."""
        timing = self.timing.get((self.point.id, workload))
        profiles = {a: resume_run.without_profile_rows(r) for (p, w, a), r in self.profiles.items()
                    if p == self.point and w == workload}
        self.units[resume_run.unit_key(self.point.id, workload)] = {"timing": timing, "profiles": profiles}
        self.run_row["resume_json"] = reports.to_json(self.units)

    def flush(self) -> None:
        self._stamp()
        run_id = self.run_row["run_id"]
        self.run_row["telemetry_json"] = reports.to_json(self.sampler.info())
        steps = self.steps_frame()
        reports.write_table(self.out_dir, "steps", steps.assign(run_id=run_id) if len(steps) else [])
        if self.sampler.available and len(steps):
            samples = self.samples_frame()
            reports.write_table(self.out_dir, "telemetry", samples.assign(run_id=run_id))
            reports.write_table(self.out_dir, "blocks", by_point(steps, lambda s: per_rank(telemetry.block_energy, s, samples)).assign(run_id=run_id))
        reports.write_table(self.out_dir, "correctness", self._with_prior("correctness", self.correctness).assign(run_id=run_id))
        for name in ("phases", "memory", "jit"):
            table = self._with_prior(name, getattr(self, name))
            if len(table):
                reports.write_table(self.out_dir, name, table.assign(run_id=run_id))
        if self.profiles:
            reports.write_table(self.out_dir, "ops", self.ops_frame().assign(run_id=run_id))
            reports.write_table(self.out_dir, "kernels", [
                k | {"workload": w, "arm": a, "rank": rank, "run_id": run_id, **p.columns()}
                for (p, w, a), r in self.profiles.items() for rank, result in dp.by_rank(r) for k in result["kernels"]])
        reports.write_table(self.out_dir, "run", [self.run_row])


    def ops_frame(self) -> pd.DataFrame:
        """Every profiled (point, workload, arm)'s ops, with the point's identity columns."""
        return pd.concat([explain.ops_frame(result, workload=w, arm=a).assign(rank=rank, **p.columns())
                          for (p, w, a), r in self.profiles.items() for rank, result in dp.by_rank(r)], ignore_index=True)


def _arms(config: CompareConfig, attn: str) -> list[ArmSpec]:
    """baseline and patched (or baseline twice for A/A), then the stock reference arms asked for."""
    arms = [ArmSpec("baseline", attn, False)]
    if config.aa:
        return arms + [ArmSpec(AA_ARM, attn, False)]
    arms.append(ArmSpec("patched", attn, True))
    if "sdpa" in config.reference_arms and attn != "sdpa":
        arms.append(ArmSpec("sdpa", "sdpa", False))
    if "compile" in config.reference_arms:
        # The strongest stock path: the compiler over the stock model with its fastest attention.
        arms.append(ArmSpec("compile", "sdpa", False, compile=True))
    return arms


def _with_replicas(config: CompareConfig, arms: list[ArmSpec]) -> list[ArmSpec]:
    """Every process to start: the arms, then the extra replicas of the baseline and the candidate (config.replicas
    processes each). Replicas come last and in reverse, so a round of timed blocks runs baseline, patched, ...,
    patched#1, baseline#1 and the next round the reverse: each arm's processes sit symmetric in time.
    Reference arms run once: their intervals against the candidate carry the process noise of one process.
    """
    compared = {"baseline", _candidate_arm(config)}
    extra = [replace(arm, replica=r) for r in range(1, config.replicas) for arm in arms if arm.name in compared]
    return arms + extra[::-1]


def check_before_measuring(config: CompareConfig, workloads) -> tuple[LoadedPatch, str]:
    """Everything that can be refused before a single measurement: the model, the workloads at every sequence length
    (generate on an encoder, --seq past the position table), the patch and whether it fits the model.
    Returns the loaded patch and the attention implementation the arms run with."""
    try:
        source = resolve_model(config.model)
    except ModelLoadError as exc:
        raise UsageError(f"--model: {exc}") from None
    try:
        for seq in sorted({p.seq for p in config.points}):
            check_workloads(source, workloads, seq)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    loaded = load_patch(config.patch)
    attn = loaded.patch.model_attention
    check_model_fits(loaded.patch, source.architecture, attn)
    return loaded, attn


def new_run_row(config: CompareConfig, loaded: LoadedPatch, **extra) -> dict:
    """run.parquet's row as a run starts: what was asked for, on what, with which patch source; status "running"."""
    return {
        "run_id": uuid.uuid4().hex[:12], "schema_version": reports.SCHEMA_VERSION, "status": "running",
        "command_line": config.command_line, "config_json": reports.to_json(config.to_record()),
        "environment_json": reports.to_json(capture_environment(config.device)), "patch_spec": config.patch,
        "patch_origin": loaded.origin, "patch_source_sha256": loaded.source_hash, "seed": config.seed,
        "batch_digest": None, "started_unix_ns": time.time_ns(), "ended_unix_ns": None, "failure": None, **extra,
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


def compare(config: CompareConfig, events: Events = _quiet, *, resume: bool = False) -> Report:
    """Run one comparison (see module docstring) and return its Report. Raises UsageError before measuring.

    resume: continue the interrupted run in config.out (resume.py): its finished units are kept, the others run;
    a complete run is returned as it is (Report.nothing_to_do).
    """
    if config.find_max_batch:
        raise UsageError("find_max_batch: this searches batch sizes instead of comparing; call e2eprof.maxbatch.find_max_batch")
    loaded, attn = check_before_measuring(config, config.workloads)
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
    state = _RunState(out_dir, run_row, sampler)
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
    arms = _arms(config, attn)
    scratch = Path(tempfile.mkdtemp(prefix="e2eprof-scratch-"))
    run_row["points_json"] = reports.to_json([p.columns() for p in config.points])
    try:
        with recording_status(run_row):
            for index, point in enumerate(config.points):
                if config.is_sweep:
                    events("point", point=point, index=index, total=len(config.points))
                _run_point(config.at(point), point, arms, state, loaded.patch, scratch, events)
            if config.microbench:
                for point in config.points:
                    with state.phase(events, "*", f"microbench {point.id}"):
                        _microbench_phase(config.at(point), point, state)
            sampler.stop()
            with state.phase(events, "*", "summary and tables"):
                balance = (by_point(state.steps_frame(), lambda steps: telemetry.arm_balance(
                    steps, clock_tolerance=config.clock_tolerance, temp_tolerance_c=config.temp_tolerance_c)).to_dict("records")
                    if sampler.available else [])
                if balance:
                    reports.write_table(out_dir, "balance", [r | {"run_id": run_id} for r in balance])
                steps = state.all_rows("steps")
                summary, verdicts = summarize(steps, state.all_rows("correctness"), config,
                                              state.failed_by_point, balance, state.timing, jit=state.all_rows("jit"))
                _explain_into(summary, state, run_id)
                dp.attach_rank_columns(summary, steps, state.profiles)
                _flag_implausible(summary, verdicts, config)
                attach_memory(summary, state.all_rows("memory"))
                run_row["verdict"] = worst([v.verdict for v in verdicts.values()])  # the run's: worst over (point, workload)
                reports.write_table(out_dir, "summary", [r | {"run_id": run_id} for r in summary])
    finally:
        sampler.stop()
        state.flush()
        shutil.rmtree(scratch, ignore_errors=True)
    overall = run_row["verdict"]
    return Report(out_dir, run_id, pd.DataFrame(summary), verdicts, overall)


def _microbench_phase(config: CompareConfig, point, state: _RunState) -> None:
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


def _run_point(config: CompareConfig, point: SweepPoint, arms: list[ArmSpec], state: _RunState, patch, scratch: Path,
               events: Events) -> None:
    """Every workload at one point, in fresh worker processes (config holds this point's batch, seq and precision).

    Fresh workers per point, not one set reshaped between points: a process's peak RSS, its allocator's cached
    blocks and torch.compile's shape specialisations (a recompile turns dynamic shapes on) would otherwise carry
    from one point into the next, and an out-of-memory point could leave the next one a fragmented heap.
    """
    state.begin_point(point)
    todo = [w for w in config.workloads if resume_run.unit_key(point.id, w) not in state.units]
    if not todo:  # every unit of this point was finished by an earlier attempt (--resume)
        state.end_point()
        return
    processes: dict[str, ArmProcess] = {}  # by process key: the arm's name, "<arm>#<replica>" for its replicas
    try:
        specs = _with_replicas(config, arms)
        placements = isolation.plan(len(specs), config.isolate) if config.launch is None else [None] * len(specs)
        asked = {arm.key: placement.describe() for arm, placement in zip(specs, placements) if placement is not None}
        with state.phase(events, "*", "start workers and build models", ", ".join(a.key for a in specs)):
            for index, (arm, placement) in enumerate(zip(specs, placements)):
                processes[arm.key] = start_arm(WorkerSetup(
                    arm=arm, model=config.model, patch_spec=config.patch, device=config.device,
                    precision=config.precision, seed=config.seed, batch=config.batch, seq=config.seq,
                    new_tokens=config.new_tokens, scratch_dir=str(scratch),
                    placement=placement or isolation.Placement()), config.launch, index)
            builds = _broadcast(processes, state, "build")
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
            state.run_row["sites_json"] = reports.to_json(builds.get("patched", {}).get("sites"))
            # Data-parallel arms: each rank's pid, device and GPU UUID (single-process builds have no "ranks").
            state.run_row["ranks_json"] = reports.to_json({a: b["ranks"] for a, b in builds.items() if "ranks" in b})
        events("built", builds=builds)
        for workload in todo:
            _run_workload(config, workload, processes, state, patch, scratch, events)
            # Peaks per unit, so a finished unit's rows are complete when it is recorded as finished. An arm's
            # replicas hold the same model and batches: its first process speaks for its memory.
            firsts = {k: p for k, p in processes.items() if not is_replica(k)}
            for rows in _broadcast(firsts, state, "memory_peaks").values():
                state.memory += [r for r in rows if r["workload"] == workload]
            for rows in _broadcast(processes, state, "jit_counts").values():  # every process: all of them were timed
                state.jit += [r for r in rows if r["workload"] == workload]
            _broadcast(processes, state, "end_workload", workload=workload)
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


def _explain_into(summary: list[dict], state: _RunState, run_id: str) -> None:
    """Op diff and Amdahl explanation per workload from the profiles; adds prediction columns to the summary."""
    if not state.profiles:
        return
    ops = state.ops_frame()
    # Arms are compared op by op on rank 0 (every rank runs the same ops on its own shard).
    reports.write_table(state.out_dir, "opdiff", by_point(ops[ops["rank"] == 0], explain.op_diff).assign(run_id=run_id))
    points = {p.id: p for p, _, _ in state.profiles}
    rows = []
    for row in summary:
        point = points.get(row.get("point"))
        profile = state.profiles.get((point, row["workload"], row["arm"]))
        if profile:
            row["profile_device_ms"] = profile["total_device_us"] / 1e3
            row["idle_share"] = profile["idle_share"]
            row["replaced_ms"] = profile["replaced_device_us"] / 1e3 if profile["device_type"] == "cuda" else profile["replaced_cpu_us"] / 1e3
        base = state.profiles.get((point, row["workload"], "baseline"))
        if row["arm"] != "patched" or not profile or not base:
            continue
        result = explain.explain(row["workload"], base, profile, row.get("speedup_vs_baseline", math.nan),
                                 measured_low=row.get("ci_low", math.nan))
        rows.append({**point.columns(), "workload": row["workload"], **{k: v for k, v in result.items() if not isinstance(v, (list, dict))},
                     "grown_ops": reports.to_json(result.get("grown_ops")), "run_id": run_id})
        row.update(replaced_share=result["f"], replaced_speedup=result["s"], predicted_speedup=result["predicted"],
                   amdahl_bound=result["bound"], cause=result["cause"], cause_detail=result["detail"])
    if rows:
        reports.write_table(state.out_dir, "explain", rows)


def _flag_implausible(summary: list[dict], verdicts: dict, config: CompareConfig) -> None:
    """A step gain beyond the Amdahl bound (explain's cause "implausible") reaches the verdict as IMPLAUSIBLE_GAIN."""
    points = {p.id: p for p in config.points}
    for row in summary:
        if row.get("cause") != "implausible" or row.get("verdict") is None:
            continue
        key = verdict_key(config, points[row["point"]], row["workload"])
        sure = row["ci_low"] if math.isfinite(row.get("ci_low", math.nan)) else row["speedup_vs_baseline"]
        detail = (f"the step gained at least {sure:.3f}x, but the replaced region ({row['replaced_share']:.1%} of the "
                  f"baseline step) allows at most {row['amdahl_bound']:.3f}x: work skipped or moved off the clock, "
                  f"or the profile's range misses calls")
        verdicts[key] = flag_implausible(verdicts[key], detail)
        row.update(verdict=verdicts[key].verdict, reasons=",".join(verdicts[key].reasons), advice=verdicts[key].advice)


def _broadcast(processes: dict[str, ArmProcess], state: _RunState, command: str, **kwargs) -> dict[str, dict]:
    """Send one command to every live arm, then collect: slow phases (model builds) overlap across arms.

    A failure, out of memory included, is recorded as it comes: a build that does not fit beside the others is not
    retried (an arm that cannot be built alongside the others cannot be measured alongside them either); a
    replica that does not fit is left out and its arm goes on (_process_failed).
    """
    return _overlapped(processes, state, {name: (command, kwargs) for name in processes}, retry_out_of_memory=False)


def _process_failed(processes: dict[str, ArmProcess], state: _RunState, key: str, failure: ArmFailed, phase: str,
                    workload: str = "*") -> None:
    """A process of an arm failed. A replica that ran out of memory beside the other processes is closed and left
    out, with a row saying so: its arm goes on with fewer processes (and an interval with more process noise).
    Anything else is its arm's failure (the same code failed), recorded by _record_failure.
    """
    if is_replica(key) and is_oom(failure):
        state.correctness.append({
            "workload": workload, "arm": arm_of(key), "tensor": "-", "metric": "replica_dropped", "value": 1.0,
            "tolerance": math.nan, "passed": True,  # informational: the arm stays, its interval widens
            "detail": f"{key} ran out of memory during {phase} beside the other processes: {failure.message}"})
        processes.pop(key).close()
        return
    _record_failure(state, failure, phase, workload)


def _record_failure(state: _RunState, failure: ArmFailed, phase: str, workload: str = "*") -> None:
    if is_oom(failure):
        # Not a bug in the arm: this point is too large for it. Recorded, and the arm sits out this workload only
        # (the worker has freed what the workload held); running out while building leaves it nothing to run.
        state.correctness.append(oom_row(workload, failure.arm, phase, failure.message))
        if workload != "*":
            state.out_of_memory.add((failure.arm, workload))
            return
        state.arm_failures[failure.arm] = failure
        return
    state.arm_failures[failure.arm] = failure
    state.correctness.append({"workload": workload, "arm": failure.arm, "tensor": "-", "metric": "arm_failed",
                              "value": math.nan, "tolerance": math.nan, "passed": False,
                              "detail": f"during {phase}: {failure}"})


def _left_out(processes, state, key: str, workload: str | None) -> bool:
    """Whether a process gets no more commands: a replica dropped since the caller listed the processes
    (_process_failed), an arm that failed, or one out of memory in this workload."""
    return key not in processes or arm_of(key) in state.arm_failures or (arm_of(key), workload) in state.out_of_memory


def _call(processes, state, key: str, command: str, args: dict | None = None):
    """One command to one arm's process (key: the arm, or "<arm>#<replica>"); a failure is recorded (not raised)
    and the arm, all its processes, is left out from then on."""
    args = args or {}
    interrupt.check()
    if _left_out(processes, state, key, args.get("workload")):
        return None
    try:
        return processes[key].call(command, **args)
    except ArmFailed as failure:
        _process_failed(processes, state, key, failure, command, args.get("workload", "*"))
        return None


# torch.compile over Hugging Face decoding with a dynamic KV cache recompiles for new lengths before it settles
# (gpt2 on the H200: 65 s of compilation and 40 s of warm-up for a 32-token generate): that measures the compiler's
# cache, not decoding. A fair compiled decoding arm needs a static cache, so the compile arm sits generate out.
SITS_OUT = {("compile", "generate")}


def _run_workload(config, workload, processes, state, patch, scratch, events) -> None:
    # Every process still measuring (replicas too), and the arms' first processes only: correctness, counters
    # and profiles are properties of the code an arm runs, checked once; timing needs every process.
    live = lambda: [k for k in processes if arm_of(k) not in state.arm_failures  # noqa: E731
                    and (arm_of(k), workload) not in state.out_of_memory and (arm_of(k), workload) not in SITS_OUT]
    first = lambda: [k for k in live() if not is_replica(k)]  # noqa: E731
    before = {a: _call(processes, state, a, "counters") for a in first()}
    first_step = len(state.steps)  # this workload's steps are state.steps[first_step:]
    patched_live = "patched" in live()

    with state.phase(events, workload, "cold step"):
        for arm in live():
            state.steps += _call(processes, state, arm, "cold", {"workload": workload}) or []

    with state.phase(events, workload, "correctness"):
        _correctness_gate(config, workload, processes, state, patch, scratch, first)
        if patched_live and "patched" not in live():  # failed in its cold step or in the gate's capture
            _diagnose_failure(workload, processes, state, scratch)
        _trained_like_check(workload, processes, state)

    with state.phase(events, workload, "warm-up"):
        for arm in live():
            state.steps += _call(processes, state, arm, "warmup", {
                "workload": workload, "window": max(config.block_steps, 3), "tolerance": config.warmup_tolerance,
                "max_steps": config.max_warmup_steps, "max_seconds": config.max_warmup_seconds}) or []

    with state.phase(events, workload, "timing"):
        _timed_blocks(config, workload, processes, state, events, live)

    after = {a: _call(processes, state, a, "counters") for a in first()}
    state.correctness += kernel_ran_rows(workload, before, after)
    state.correctness += thread_rows(workload, state.steps[first_step:])
    with state.phase(events, workload, "revalidation"):
        _revalidate(config, workload, processes, state, patch, scratch)
    state.flush()

    if config.profile:
        with state.phase(events, workload, "profile",
                         "{} warm-up + {} active steps per arm".format(*profile_steps_for(config, workload))):
            _profile_arms(config, workload, processes, state, patch, first)


def _timed_blocks(config, workload, processes, state, events, live) -> None:
    """Interleaved blocks: the fixed --steps first, then more rounds until the interval is tight enough.

    The stopping rule looks at the interval's width only, never at which side of 1 it lies: stopping when a
    result looks significant would inflate false alarms, stopping on precision does not.
    """
    events("timing", workload=workload, total=config.n_blocks * len(live()))
    order = live()
    started = time.perf_counter()
    block, reason = 0, "fixed steps"
    while True:
        steps = min(config.block_steps, config.steps - block * config.block_steps) if block < config.n_blocks else config.block_steps
        # Alternate the order each round (ABC, CBA, ...): ABBA for two arms, balanced for three.
        for arm in (order if block % 2 == 0 else list(reversed(order))):
            state.steps += _call(processes, state, arm, "block", {"workload": workload, "block": block, "steps": steps}) or []
            events("advance", workload=workload)
        state.flush()
        block += 1
        if block < config.n_blocks:
            continue
        reason = _stop_reason(config, state, workload, block, time.perf_counter() - started)
        if reason:
            break
        events("timing_extend", workload=workload, total=(block + 1) * len(live()))
    state.timing[(state.point.id, workload)] = {"blocks": block, "stop_reason": reason, "timing_s": time.perf_counter() - started}


# How many budgets' worth of projected timing make the target interval "out of reach" (see _stop_reason).
OUT_OF_REACH = 2.0


def _stop_reason(config, state, workload: str, blocks: int, elapsed: float) -> str | None:
    """Why timing may stop now, or None to run another round."""
    if config.budget_seconds <= 0:
        return "fixed steps"
    candidate = _candidate_arm(config)
    if candidate in state.arm_failures or "baseline" in state.arm_failures:
        return "arm failed"
    if {(candidate, workload), ("baseline", workload)} & state.out_of_memory:
        return "out of memory"
    here = state.point.id  # rows of earlier points carry their own id; this point's may not be stamped yet
    warm = dp.slowest_rank([s for s in state.steps if s["workload"] == workload and s["phase"] == "warm"
                            and s.get("point", here) == here])
    base = [s for s in warm if s["arm"] == "baseline"]
    cand = [s for s in warm if s["arm"] == candidate]
    if len(base) >= 2 and len(cand) >= 2:
        # The summary's own interval (its process noise included: the device's floor or what these replicas show),
        # so timing stops on the interval the verdict will use.
        whole = summary_interval(pd.DataFrame(base + cand), workload, config, candidate, n_boot=1000)
        if stats.ci_halfwidth_rel(whole) <= config.target_half_width:
            return "target interval reached"
        ci = stats.without_process_noise(whole)
        noise = whole.process_noise
        # Precision, not the result, again: the within-run part of an interval narrows about as 1/sqrt(time) while
        # the process-noise part does not, so timing stops when even OUT_OF_REACH budgets would not bring the whole
        # interval to the target (host-bound decoding on the H200: +-7% after 30 s, which the 60 s budget cannot
        # bring near 1%), or at once when the process noise alone is wider than the target.
        floor = stats.process_noise_half_width(noise, config.confidence)
        if floor >= config.target_half_width:
            return "target below the process noise"
        needed = math.sqrt(config.target_half_width ** 2 - floor ** 2)
        if elapsed * (stats.ci_halfwidth_rel(ci) / needed) ** 2 > OUT_OF_REACH * config.budget_seconds:
            return "target out of reach within the budget"
    if elapsed >= config.budget_seconds:
        return "time budget spent"
    if blocks >= config.max_blocks:
        return "block limit reached"
    return None


def _candidate_arm(config: CompareConfig) -> str:
    """The arm whose speedup over the baseline is judged: the patched model, or the second baseline in A/A."""
    return AA_ARM if config.aa else "patched"


def _overlapped(processes, state, calls: dict[str, tuple[str, dict]], *,
                retry_out_of_memory: bool = True) -> dict[str, object]:
    """One command per arm, all sent before any answer is awaited: untimed work overlaps across arms.

    Only for work that is not timed (correctness captures): the compile arm's recompilation for eval mode, the fp64
    reference and the other arms' captures then take as long as the slowest of them, not their sum. An arm that
    runs out of memory beside the others is asked again alone, as it would have been run before, once every other
    process has emptied its allocator cache; a second failure is recorded like any other (with
    retry_out_of_memory=False, the first). Results by arm; a failed arm is left out.
    """
    interrupt.check()
    sent = []
    for arm, (command, args) in calls.items():
        if _left_out(processes, state, arm, args.get("workload")):
            continue
        try:
            processes[arm].send(command, **args)
            sent.append(arm)
        except ArmFailed as failure:
            _process_failed(processes, state, arm, failure, command, args.get("workload", "*"))
    results, alone = {}, []
    for arm in sent:
        try:
            results[arm] = processes[arm].receive()
        except ArmFailed as failure:
            if retry_out_of_memory and is_oom(failure):
                alone.append(arm)
            else:
                _process_failed(processes, state, arm, failure, calls[arm][0], calls[arm][1].get("workload", "*"))
    if alone:
        # Before the retries, the other processes give their allocator caches back: their own work in this round
        # (captures, an fp64 reference) has just filled them, and an arm retried alone still shares the device
        # with every process's cache. llama-1b's train gate on the H200 ran out this way with two processes per
        # arm and the compile arm beside the fp64 reference.
        _overlapped(processes, state, {key: ("release_cached_memory", {}) for key in processes if key not in alone},
                    retry_out_of_memory=False)
    for arm in alone:
        command, args = calls[arm]
        result = _call(processes, state, arm, command, args)
        if result is not None:
            results[arm] = result
    return results


def _correctness_gate(config, workload, processes, state, patch, scratch, live) -> None:
    """fp64 reference from the stock baseline, captures of every arm on pristine weights, op checks in the patched arm.

    The captures of the other arms overlap the baseline's fp64 reference; the baseline's own capture follows it.
    """
    def capture(arm):
        return "capture", {"workload": workload, "path": scratch_path(str(scratch), arm, workload, "capture"),
                           "verify": arm == "patched"}

    first = {arm: capture(arm) for arm in live() if arm != "baseline"}
    first["baseline"] = ("reference", {"workload": workload,
                                       "path": scratch_path(str(scratch), "fp64", workload, "reference")})
    results = _overlapped(processes, state, first)
    reference = results.pop("baseline", None)
    if "baseline" in live():
        baseline = _call(processes, state, "baseline", *capture("baseline"))
        if baseline is not None:
            results["baseline"] = baseline
    captures = {}
    for arm in live():  # in the arms' order, so the rows are too
        result = results.get(arm)
        if result:
            captures[arm] = result["path"]
            state.correctness += op_check_rows(workload, arm, result["op_checks"])
            if arm == "patched":
                state.correctness += call_check_rows(workload, arm, result["op_checks"])
            state.correctness += dp.rank_agreement_rows(workload, arm, result, dp.agreement_tolerance(patch, config.precision))
    device_type = str(config.device).split(":")[0]
    if reference and reference.get("device", device_type) != device_type:
        state.correctness.append({  # informational: where the trusted values came from
            "workload": workload, "arm": "baseline", "tensor": "-", "metric": "reference_on_host", "value": 1.0,
            "tolerance": math.nan, "passed": True,
            "detail": f"the fp64 reference did not fit on {config.device} beside the other arms' processes and ran "
                      f"on the host instead (same model, weights and batch)"})
    if reference and "baseline" in captures:
        state.correctness += compare_captures(workload, reference["path"], captures, patch, config.precision)


def _trained_like_check(workload, processes, state) -> None:
    """The patched arm's calls checked once more on trained-like weights and a padded batch (workloads.trained_like):
    the values real checkpoints give kernels, which a random-init model never does. One row, metric "trained_like"."""
    if "patched" not in processes or "patched" in state.arm_failures:
        return
    result = _call(processes, state, "patched", "trained_like", {"workload": workload})
    if result is None:
        return  # recorded as arm_failed
    if result.get("skipped"):
        state.correctness.append({"workload": workload, "arm": "patched", "tensor": "-", "metric": "trained_like",
                                  "value": 0.0, "tolerance": 0.0, "passed": True,
                                  "detail": f"not run: {result['skipped']}"})
        return
    checks = result["op_checks"]
    rows = op_check_rows(workload, "patched", checks) + call_check_rows(workload, "patched", checks)
    failed = [r for r in rows if not r["passed"]]
    calls = sum(c["calls"] for c in checks)
    detail = (f"{result['transform']}: " + ("; ".join(f"{r['metric']} {r['tensor']}: {r['detail'].removeprefix(r['tensor'] + ': ')}" for r in failed[:3])
                                            if failed else f"{calls} calls of {len(checks)} signatures checked in "
                                                           f"{result['seconds']:.2f} s, none wrong"))
    state.correctness.append({"workload": workload, "arm": "patched", "tensor": "-", "metric": "trained_like",
                              "value": float(len(failed)), "tolerance": 0.0, "passed": not failed,
                              "detail": detail[:600] if checks else f"{result['transform']}: the patch was not called"})


def _diagnose_failure(workload, processes, state, scratch) -> None:
    """The patched arm raised before its checks ran: run its verified capture anyway, to say why.

    An output the model cannot use (on another device, of another shape) makes the model's next op raise in the
    cold step, before any per-call check; the verified call records such a finding and hands the model the stock
    output, so this capture usually finishes and names the check (output_device, ...) next to the arm_failed row.
    A worker that died, or a kernel that raises again, tells nothing more: the arm_failed row stands alone.
    """
    failure = state.arm_failures.get("patched")
    if failure is None or failure.kind != "error" or is_oom(failure):
        return
    try:
        result = processes["patched"].call("capture", workload=workload, verify=True,
                                           path=scratch_path(str(scratch), "patched", workload, "diagnosis"))
    except ArmFailed:
        return
    state.correctness += op_check_rows(workload, "patched", result["op_checks"])
    state.correctness += call_check_rows(workload, "patched", result["op_checks"])


def _revalidate(config, workload, processes, state, patch, scratch) -> None:
    """After timing, check the patched arm once more: a kernel right during the gate but wrong later fails here.

    The same capture as the gate (pristine weights, the gate's batch, so the fp64 reference still applies), with
    every call checked again, including with new contents at the same addresses. One row, metric "revalidation".
    """
    if "patched" not in processes or "patched" in state.arm_failures:
        return
    result = _call(processes, state, "patched", "capture", {
        "workload": workload, "path": scratch_path(str(scratch), "patched", workload, "revalidate"), "verify": True,
        "extended": False})  # the gate moved these signatures' inputs to other shapes and ranges: not again
    if result is None:
        return  # recorded as arm_failed
    rows = op_check_rows(workload, "patched", result["op_checks"]) + call_check_rows(workload, "patched", result["op_checks"])
    reference = Path(scratch_path(str(scratch), "fp64", workload, "reference"))
    baseline = Path(scratch_path(str(scratch), "baseline", workload, "capture"))
    if reference.exists() and baseline.exists():
        rows += [r for r in compare_captures(workload, str(reference), {"baseline": str(baseline), "patched": result["path"]},
                                             patch, config.precision) if r["arm"] == "patched"]
    failed = [r for r in rows if not r["passed"]]
    detail = "; ".join(f"{r['metric']} {r['tensor']}: {r['detail']}" for r in failed[:3]) if failed else \
        f"{len(rows)} checks passed again after timing"
    state.correctness.append({"workload": workload, "arm": "patched", "tensor": "-", "metric": "revalidation",
                              "value": float(len(failed)), "tolerance": 0.0, "passed": not failed, "detail": detail})


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


def profile_steps_for(config: CompareConfig, workload: str) -> tuple[int, int]:
    """(warm-up, active) profiled steps for a workload.

    One generate step is new_tokens forward passes, each with the module ranges and shapes the profiler records:
    on the H200 the default 2 + 3 steps of a 32-token decode took 110 s over three arms, a quarter of the whole
    run. One warm-up and one active step already hold new_tokens calls of every op, so decoding gets at most that.
    """
    if workload in DECODING_WORKLOADS:
        return min(config.profile_warmup, 1), min(config.profile_steps, 1)
    return config.profile_warmup, config.profile_steps


def _profile_arms(config, workload, processes, state, patch, live) -> None:
    # The compiled arm is left out: module ranges would break its graphs, so its profile could not be attributed,
    # and profiling it re-traces the model (over a minute for generate on the H200). Its device time per step is
    # in steps.parquet all the same.
    warmup, active = profile_steps_for(config, workload)
    for arm in [a for a in live() if a != "compile"]:
        trace = str(state.out_dir / f"trace-{workload}-{arm}.json.gz") if config.trace else None
        result = _call(processes, state, arm, "profile", {"workload": workload, "warmup": warmup,
                                                            "active": active, "trace_path": trace})
        if result is None:
            continue
        state.profiles[(state.point, workload, arm)] = result["result"]
        state.correctness.append({
            "workload": workload, "arm": arm, "tensor": "-", "metric": "profile_complete",
            "value": float(not result["problems"]), "tolerance": 1.0, "passed": not result["problems"],
            "detail": "; ".join(result["problems"]) or "trace complete" + (
                "; patch kernels present" if arm == "patched" and patch.kernel_names else "")})


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
