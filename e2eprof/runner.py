"""`compare`: orchestrate the arms of one comparison and write its report tables as the run goes.

Per workload: a cold first step in every arm, the correctness gate on pristine weights (fp64 reference from
the baseline, op-level checks in the patched arm), warm-up until the median levels off, then timed blocks in
alternating order (A B C, C B A, ...) so drift and heating do not favour one arm.
"""

from __future__ import annotations

import datetime as dt
import math
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from e2eprof import explain, reports, stats, telemetry
from e2eprof.arm_process import ArmFailed, ArmProcess
from e2eprof.config import AA_ARM, CompareConfig, default_out_dir
from e2eprof.correctness import compare_captures, op_check_rows
from e2eprof.env import capture_environment
from e2eprof.errors import RunError, UsageError
from e2eprof.patching import check_model_fits
from e2eprof.registry import load_patch
from e2eprof.summary import summarize
from e2eprof.verdict import EXIT_CODES, Verdict, worst
from e2eprof.worker import ArmSpec, WorkerSetup, scratch_path
from e2eprof.workloads.loops import check_workloads
from e2eprof.workloads.models import ModelLoadError, resolve_model

Events = Callable[..., None]


def _quiet(kind: str, **info) -> None:
    pass


@dataclass
class Report:
    """What `compare` returns: where the tables are, the per-workload verdicts, and the exit code."""

    run_dir: Path
    run_id: str
    summary: pd.DataFrame
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    overall: str = "INCONCLUSIVE"
    status: str = "complete"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.overall]


def prepare_out_dir(config: CompareConfig) -> Path:
    """The run directory; refuses to mix a new run into an old one unless --force."""
    out = config.out or default_out_dir(config.model, config.patch, dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ"))
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out: {out} exists and is not a directory")
    if out.exists() and any(out.iterdir()):
        if not config.force:
            raise UsageError(f"--out: {out} already holds a report; use --force to overwrite it")
        for old in out.glob("*.parquet"):
            old.unlink()
    out.mkdir(parents=True, exist_ok=True)
    return out


class _RunState:
    """Everything measured so far, flushed to Parquet after each phase so nothing is lost."""

    def __init__(self, out_dir: Path, run_row: dict, sampler: telemetry.TelemetrySampler):
        self.out_dir = out_dir
        self.sampler = sampler
        self.run_row = run_row
        self.steps: list[dict] = []
        self.correctness: list[dict] = []
        self.arm_failures: dict[str, ArmFailed] = {}
        self.profiles: dict[tuple[str, str], dict] = {}  # (workload, arm) -> ProfileResult.to_dict()
        self.phases: list[dict] = []  # where the run's own wall time went (issue: timing should dominate)
        self.timing: dict[str, dict] = {}  # workload -> blocks run, why timing stopped, seconds

    @contextmanager
    def phase(self, events: Events, workload: str, name: str, detail: str = "") -> Iterator[None]:
        """Announce a phase and record its wall time in phases.parquet, also when it fails."""
        events("phase", name=f"{workload}: {name}" if workload != "*" else name, detail=detail)
        start = time.time_ns()
        try:
            yield
        finally:
            end = time.time_ns()
            self.phases.append({"workload": workload, "phase": name, "start_unix_ns": start, "end_unix_ns": end,
                                "seconds": (end - start) / 1e9})

    def steps_frame(self) -> pd.DataFrame:
        """Steps joined with the telemetry samples that fall inside each step (clocks, temperature, throttling)."""
        steps = pd.DataFrame(self.steps)
        samples = self.sampler.frame() if self.sampler.available else None
        if samples is None or not len(samples) or not len(steps):
            return steps
        return telemetry.join_steps(steps, samples)

    def flush(self) -> None:
        run_id = self.run_row["run_id"]
        self.run_row["telemetry_json"] = reports.to_json(self.sampler.info())
        steps = self.steps_frame()
        reports.write_table(self.out_dir, "steps", steps.assign(run_id=run_id) if len(steps) else [])
        if self.sampler.available and len(steps):
            samples = self.sampler.frame()
            reports.write_table(self.out_dir, "telemetry", samples.assign(run_id=run_id))
            reports.write_table(self.out_dir, "blocks", telemetry.block_energy(steps, samples).assign(run_id=run_id))
        reports.write_table(self.out_dir, "correctness", [r | {"run_id": run_id} for r in self.correctness])
        if self.phases:
            reports.write_table(self.out_dir, "phases", [r | {"run_id": run_id} for r in self.phases])
        if self.profiles:
            reports.write_table(self.out_dir, "ops", pd.concat(
                [explain.ops_frame(r, workload=w, arm=a) for (w, a), r in self.profiles.items()], ignore_index=True
            ).assign(run_id=run_id))
            reports.write_table(self.out_dir, "kernels", [
                k | {"workload": w, "arm": a, "run_id": run_id} for (w, a), r in self.profiles.items() for k in r["kernels"]])
        reports.write_table(self.out_dir, "run", [self.run_row])


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


def compare(config: CompareConfig, events: Events = _quiet) -> Report:
    """Run one comparison (see module docstring) and return its Report. Raises UsageError before measuring."""
    try:
        source = resolve_model(config.model)
    except ModelLoadError as exc:
        raise UsageError(f"--model: {exc}") from None
    try:
        check_workloads(source, config.workloads, config.seq)  # e.g. generate on an encoder, --seq past positions
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    loaded = load_patch(config.patch)
    attn = loaded.patch.attn_implementation or "eager"
    check_model_fits(loaded.patch, source.architecture, attn)
    out_dir = prepare_out_dir(config)
    events("start", config=config, run_dir=out_dir)

    run_id = uuid.uuid4().hex[:12]
    run_row = {
        "run_id": run_id, "schema_version": reports.SCHEMA_VERSION, "status": "running",
        "command_line": config.command_line, "config_json": reports.to_json(config.to_record()),
        "environment_json": reports.to_json(capture_environment(config.device)), "patch_spec": config.patch,
        "patch_origin": loaded.origin, "patch_source_sha256": loaded.source_hash, "seed": config.seed,
        "batch_digest": None, "model_json": None, "started_unix_ns": time.time_ns(), "ended_unix_ns": None,
        "failure": None,
    }
    sampler = telemetry.open_sampler(config.device)  # in the parent: sampling never runs inside a timed step
    run_row["telemetry_available"] = sampler.available
    run_row["telemetry_unavailable_reason"] = sampler.unavailable_reason
    if sampler.available:
        sampler.start()
    else:
        events("phase", name="telemetry unavailable", detail=sampler.unavailable_reason)
    state = _RunState(out_dir, run_row, sampler)
    state.flush()
    arms = _arms(config, attn)
    scratch = Path(tempfile.mkdtemp(prefix="e2eprof-scratch-"))
    processes: dict[str, ArmProcess] = {}
    try:
        with state.phase(events, "*", "start workers and build models", ", ".join(a.name for a in arms)):
            for arm in arms:
                processes[arm.name] = ArmProcess(WorkerSetup(
                    arm=arm, model=config.model, patch_spec=config.patch, device=config.device,
                    precision=config.precision, seed=config.seed, batch=config.batch, seq=config.seq,
                    new_tokens=config.new_tokens, scratch_dir=str(scratch)))
            builds = _broadcast(processes, state, "build")
        if "baseline" not in builds:
            raise RunError(f"the baseline arm could not start: {state.arm_failures['baseline']}")
        run_row["model_json"] = reports.to_json(builds["baseline"]["model"])
        run_row["batch_digest"] = builds["baseline"].get("batch_digest")
        run_row["sites_json"] = reports.to_json(builds.get("patched", {}).get("sites"))
        events("built", builds=builds)
        for workload in config.workloads:
            _run_workload(config, workload, processes, state, loaded.patch, scratch, events)
            state.flush()
        sampler.stop()
        balance = (telemetry.arm_balance(state.steps_frame(), clock_tolerance=config.clock_tolerance,
                                         temp_tolerance_c=config.temp_tolerance_c) if sampler.available else [])
        if balance:
            reports.write_table(out_dir, "balance", [r | {"run_id": run_id} for r in balance])
        summary, verdicts = summarize(state.steps, state.correctness, config, set(state.arm_failures), balance, state.timing)
        _explain_into(summary, state, run_id)
        reports.write_table(out_dir, "summary", [r | {"run_id": run_id} for r in summary])
        run_row["status"] = "complete"
    except KeyboardInterrupt:
        run_row["status"] = "interrupted"
        raise
    except BaseException as exc:
        run_row["status"] = "failed"
        run_row["failure"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        sampler.stop()
        run_row["ended_unix_ns"] = time.time_ns()
        state.flush()
        for process in processes.values():
            process.close()
        shutil.rmtree(scratch, ignore_errors=True)
    overall = worst([v.verdict for v in verdicts.values()])
    return Report(out_dir, run_id, pd.DataFrame(summary), verdicts, overall)


def _explain_into(summary: list[dict], state: _RunState, run_id: str) -> None:
    """Op diff and Amdahl explanation per workload from the profiles; adds prediction columns to the summary."""
    if not state.profiles:
        return
    ops = pd.concat([explain.ops_frame(r, workload=w, arm=a) for (w, a), r in state.profiles.items()], ignore_index=True)
    reports.write_table(state.out_dir, "opdiff", explain.op_diff(ops).assign(run_id=run_id))
    rows = []
    for row in summary:
        profile = state.profiles.get((row["workload"], row["arm"]))
        if profile:
            row["profile_device_ms"] = profile["total_device_us"] / 1e3
            row["idle_share"] = profile["idle_share"]
            row["replaced_ms"] = profile["replaced_device_us"] / 1e3 if profile["device_type"] == "cuda" else profile["replaced_cpu_us"] / 1e3
        base = state.profiles.get((row["workload"], "baseline"))
        if row["arm"] != "patched" or not profile or not base:
            continue
        result = explain.explain(row["workload"], base, profile, row.get("speedup_vs_baseline", math.nan))
        rows.append({"workload": row["workload"], **{k: v for k, v in result.items() if not isinstance(v, (list, dict))},
                     "grown_ops": reports.to_json(result.get("grown_ops")), "run_id": run_id})
        row.update(replaced_share=result["f"], replaced_speedup=result["s"], predicted_speedup=result["predicted"],
                   amdahl_bound=result["bound"], cause=result["cause"], cause_detail=result["detail"])
    if rows:
        reports.write_table(state.out_dir, "explain", rows)


def _broadcast(processes: dict[str, ArmProcess], state: _RunState, command: str, **kwargs) -> dict[str, dict]:
    """Send one command to every live arm, then collect: slow phases (model builds) overlap across arms."""
    sent = []
    for name, process in processes.items():
        if name in state.arm_failures:
            continue
        try:
            process.send(command, **kwargs)
            sent.append(name)
        except ArmFailed as failure:
            _record_failure(state, failure, command)
    results = {}
    for name in sent:
        try:
            results[name] = processes[name].receive()
        except ArmFailed as failure:
            _record_failure(state, failure, command)
    return results


def _record_failure(state: _RunState, failure: ArmFailed, phase: str, workload: str = "*") -> None:
    state.arm_failures[failure.arm] = failure
    state.correctness.append({"workload": workload, "arm": failure.arm, "tensor": "-", "metric": "arm_failed",
                              "value": math.nan, "tolerance": math.nan, "passed": False,
                              "detail": f"during {phase}: {failure}"})


def _call(processes, state, arm: str, command: str, args: dict | None = None):
    """One command to one arm; a failure is recorded (not raised) and the arm is left out from then on."""
    if arm in state.arm_failures:
        return None
    args = args or {}
    try:
        return processes[arm].call(command, **args)
    except ArmFailed as failure:
        _record_failure(state, failure, command, args.get("workload", "*"))
        return None


def _run_workload(config, workload, processes, state, patch, scratch, events) -> None:
    live = lambda: [a for a in processes if a not in state.arm_failures]  # noqa: E731
    before = {a: _call(processes, state, a, "counters") for a in live()}

    with state.phase(events, workload, "cold step"):
        for arm in live():
            state.steps += _call(processes, state, arm, "cold", {"workload": workload}) or []

    with state.phase(events, workload, "correctness"):
        _correctness_gate(config, workload, processes, state, patch, scratch, live)

    with state.phase(events, workload, "warm-up"):
        for arm in live():
            state.steps += _call(processes, state, arm, "warmup", {
                "workload": workload, "window": max(config.block_steps, 3), "tolerance": config.warmup_tolerance,
                "max_steps": config.max_warmup_steps, "max_seconds": config.max_warmup_seconds}) or []

    with state.phase(events, workload, "timing"):
        _timed_blocks(config, workload, processes, state, events, live)

    after = {a: _call(processes, state, a, "counters") for a in live()}
    state.correctness += kernel_ran_rows(workload, before, after)
    state.flush()

    if config.profile:
        with state.phase(events, workload, "profile",
                         f"{config.profile_warmup} warm-up + {config.profile_steps} active steps per arm"):
            _profile_arms(config, workload, processes, state, patch, live)


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
    state.timing[workload] = {"blocks": block, "stop_reason": reason, "timing_s": time.perf_counter() - started}


def _stop_reason(config, state, workload: str, blocks: int, elapsed: float) -> str | None:
    """Why timing may stop now, or None to run another round."""
    if config.budget_seconds <= 0:
        return "fixed steps"
    candidate = _candidate_arm(config)
    if candidate in state.arm_failures or "baseline" in state.arm_failures:
        return "arm failed"
    warm = [s for s in state.steps if s["workload"] == workload and s["phase"] == "warm"]
    base = [(s["wall_ns"], s["block"]) for s in warm if s["arm"] == "baseline"]
    cand = [(s["wall_ns"], s["block"]) for s in warm if s["arm"] == candidate]
    if len(base) >= 2 and len(cand) >= 2:
        ci = stats.ratio_of_medians_ci([w for w, _ in base], [w for w, _ in cand], baseline_blocks=[b for _, b in base],
                                       candidate_blocks=[b for _, b in cand], confidence=config.confidence,
                                       n_boot=1000, seed=config.seed)
        if stats.ci_halfwidth_rel(ci) <= config.target_half_width:
            return "target interval reached"
    if elapsed >= config.budget_seconds:
        return "time budget spent"
    if blocks >= config.max_blocks:
        return "block limit reached"
    return None


def _candidate_arm(config: CompareConfig) -> str:
    """The arm whose speedup over the baseline is judged: the patched model, or the second baseline in A/A."""
    return AA_ARM if config.aa else "patched"


def _correctness_gate(config, workload, processes, state, patch, scratch, live) -> None:
    """fp64 reference from the stock baseline, captures of every arm on pristine weights, op checks in the patched arm."""
    reference = _call(processes, state, "baseline", "reference", {
        "workload": workload, "path": scratch_path(str(scratch), "fp64", workload, "reference")})
    captures = {}
    for arm in live():
        result = _call(processes, state, arm, "capture", {
            "workload": workload, "path": scratch_path(str(scratch), arm, workload, "capture"), "verify": arm == "patched"})
        if result:
            captures[arm] = result["path"]
            state.correctness += op_check_rows(workload, arm, result["op_checks"])
    if reference and "baseline" in captures:
        state.correctness += compare_captures(workload, reference["path"], captures, patch, config.precision)


def _profile_arms(config, workload, processes, state, patch, live) -> None:
    # The compiled arm is left out: module ranges would break its graphs, so its profile could not be attributed,
    # and profiling it re-traces the model (over a minute for generate on the H200). Its device time per step is
    # in steps.parquet all the same.
    for arm in [a for a in live() if a != "compile"]:
        trace = str(state.out_dir / f"trace-{workload}-{arm}.json.gz") if config.trace else None
        result = _call(processes, state, arm, "profile", {"workload": workload, "warmup": config.profile_warmup,
                                                            "active": config.profile_steps, "trace_path": trace})
        if result is None:
            continue
        state.profiles[(workload, arm)] = result["result"]
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
