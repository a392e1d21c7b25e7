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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from e2eprof import explain, reports, stats, telemetry
from e2eprof.arm_process import ArmFailed, ArmProcess
from e2eprof.config import CompareConfig, default_out_dir
from e2eprof.correctness import compare_captures, op_check_rows
from e2eprof.env import capture_environment
from e2eprof.errors import RunError, UsageError
from e2eprof.patching import check_model_fits
from e2eprof.registry import load_patch
from e2eprof.verdict import EXIT_CODES, Verdict, decide, worst
from e2eprof.worker import ArmSpec, WorkerSetup, scratch_path
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
        if self.profiles:
            reports.write_table(self.out_dir, "ops", pd.concat(
                [explain.ops_frame(r, workload=w, arm=a) for (w, a), r in self.profiles.items()], ignore_index=True
            ).assign(run_id=run_id))
            reports.write_table(self.out_dir, "kernels", [
                k | {"workload": w, "arm": a, "run_id": run_id} for (w, a), r in self.profiles.items() for k in r["kernels"]])
        reports.write_table(self.out_dir, "run", [self.run_row])


def _arms(config: CompareConfig, attn: str) -> list[ArmSpec]:
    arms = [ArmSpec("baseline", attn, False), ArmSpec("patched", attn, True)]
    if "sdpa" in config.reference_arms and attn != "sdpa":
        arms.append(ArmSpec("sdpa", "sdpa", False))
    return arms


def compare(config: CompareConfig, events: Events = _quiet) -> Report:
    """Run one comparison (see module docstring) and return its Report. Raises UsageError before measuring."""
    try:
        source = resolve_model(config.model)
    except ModelLoadError as exc:
        raise UsageError(f"--model: {exc}") from None
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
        events("phase", name="start workers", detail=", ".join(a.name for a in arms))
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
        balance = telemetry.arm_balance(state.steps_frame()) if sampler.available else []
        if balance:
            reports.write_table(out_dir, "balance", [r | {"run_id": run_id} for r in balance])
        summary, verdicts = summarize(state.steps, state.correctness, config, set(state.arm_failures), balance)
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

    events("phase", name=f"{workload}: cold step")
    for arm in live():
        state.steps += _call(processes, state, arm, "cold", {"workload": workload}) or []

    events("phase", name=f"{workload}: correctness")
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

    events("phase", name=f"{workload}: warm-up")
    for arm in live():
        state.steps += _call(processes, state, arm, "warmup", {
            "workload": workload, "window": max(config.block_steps, 3), "tolerance": config.warmup_tolerance,
            "max_steps": config.max_warmup_steps, "max_seconds": config.max_warmup_seconds}) or []

    events("timing", workload=workload, total=config.n_blocks * len(live()))
    order = live()
    for block in range(config.n_blocks):
        # Alternate the order each round (ABC, CBA, ...): ABBA for two arms, balanced for three.
        for arm in (order if block % 2 == 0 else list(reversed(order))):
            steps = min(config.block_steps, config.steps - block * config.block_steps)
            state.steps += _call(processes, state, arm, "block", {"workload": workload, "block": block, "steps": steps}) or []
            events("advance", workload=workload)
        state.flush()

    after = {a: _call(processes, state, a, "counters") for a in live()}
    state.correctness += kernel_ran_rows(workload, before, after)
    state.flush()

    if config.profile:
        events("phase", name=f"{workload}: profile", detail=f"{config.profile_warmup} warm-up + {config.profile_steps} active steps per arm")
        for arm in live():
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


def _balance_columns(balance: list[dict] | None, workload: str, arm: str) -> dict:
    for row in balance or []:
        if row["workload"] == workload and row["arm"] == arm:
            return {"sm_clock_median_mhz": row["sm_clock_median_mhz"], "gpu_temp_median_c": row["gpu_temp_median_c"],
                    "throttled_share": row["throttled_share"], "clock_imbalance": row["clock_imbalance"],
                    "temp_imbalance": row["temp_imbalance"]}
    return {}


KERNEL_PROOF_METRICS = ("patched_calls", "custom_kernel_calls", "profile_complete")


def summarize(steps: list[dict], correctness: list[dict], config: CompareConfig, failed_arms: set[str],
              balance: list[dict] | None = None):
    """Summary rows per (workload, arm) and a Verdict per workload, derived from the raw rows."""
    frame = pd.DataFrame(steps)
    checks = pd.DataFrame(correctness)
    rows, verdicts = [], {}
    for workload in config.workloads:
        warm = frame[(frame.workload == workload) & (frame.phase == "warm")] if len(frame) else frame
        arms = list(dict.fromkeys(warm.arm)) if len(warm) else []
        samples = {a: warm[warm.arm == a] for a in arms}

        def arm_ok(arm):
            if not len(checks):
                return False
            mine = checks[(checks.arm == arm) & checks.workload.isin([workload, "*"])]
            return bool(len(mine)) and bool(mine.passed.all())

        def ratio_ci(base_arm, cand_arm):
            if base_arm not in samples or cand_arm not in samples:
                return None
            b, c = samples[base_arm], samples[cand_arm]
            return stats.ratio_of_medians_ci(b.wall_ns.to_numpy() / 1e6, c.wall_ns.to_numpy() / 1e6,
                                             baseline_blocks=b.block.to_numpy(), candidate_blocks=c.block.to_numpy(),
                                             confidence=config.confidence, seed=config.seed)

        vs_base = {a: ratio_ci("baseline", a) for a in arms if a != "baseline"}
        patched_vs_sdpa = ratio_ci("sdpa", "patched")
        for arm in arms:
            d = stats.describe(samples[arm].wall_ns.to_numpy() / 1e6)
            cold = frame[(frame.workload == workload) & (frame.arm == arm) & (frame.phase == "cold")]
            ci = vs_base.get(arm)
            mw = (stats.mann_whitney(samples["baseline"].wall_ns.to_numpy(), samples[arm].wall_ns.to_numpy())
                  if arm != "baseline" and "baseline" in samples else None)
            rows.append({
                "workload": workload, "arm": arm, "n": d["n"], "median_ms": d["median"], "mean_ms": d["mean"],
                "p10_ms": d["p10"], "p90_ms": d["p90"], "iqr_ms": d["iqr"], "cv": d["cv"],
                "cold_ms": cold.wall_ns.iloc[0] / 1e6 if len(cold) else math.nan,
                "device_median_ms": float(np.nanmedian(samples[arm].device_ms)) if samples[arm].device_ms.notna().any() else math.nan,
                "ttft_median_ms": float(samples[arm].ttft_ms.median()) if workload == "generate" else math.nan,
                "tpot_median_ms": float(samples[arm].tpot_ms.median()) if workload == "generate" else math.nan,
                "speedup_vs_baseline": ci.ratio if ci else (1.0 if arm == "baseline" else math.nan),
                "ci_low": ci.low if ci else math.nan, "ci_high": ci.high if ci else math.nan,
                "mw_p": mw.p_two_sided if mw else math.nan,
                "speedup_vs_sdpa": patched_vs_sdpa.ratio if (arm == "patched" and patched_vs_sdpa) else math.nan,
                "sdpa_ci_low": patched_vs_sdpa.low if (arm == "patched" and patched_vs_sdpa) else math.nan,
                "sdpa_ci_high": patched_vs_sdpa.high if (arm == "patched" and patched_vs_sdpa) else math.nan,
                "correct": arm_ok(arm), "verdict": None, "reasons": None,
                **_balance_columns(balance, workload, arm),
            })
        ci = vs_base.get("patched")
        mine = checks[checks.workload == workload] if len(checks) else checks
        proof = mine[(mine.arm == "patched") & mine.metric.isin(KERNEL_PROOF_METRICS)] if len(mine) else mine
        patched_ran = bool((proof.metric == "patched_calls").any()) and bool(proof.passed.all()) if len(proof) else False
        stock_calls = mine[(mine.arm != "patched") & (mine.metric == "custom_kernel_calls")] if len(mine) else mine
        baseline_clean = bool(stock_calls.passed.all()) if len(stock_calls) else True
        correctness_rows = checks[(checks.arm == "patched") & checks.workload.isin([workload, "*"])
                                  & ~checks.metric.isin(KERNEL_PROOF_METRICS)] if len(checks) else checks
        verdict = decide(
            correct=bool(len(correctness_rows)) and bool(correctness_rows.passed.all()),
            kernel_ran=patched_ran, baseline_clean=baseline_clean,
            arm_failed=bool({"patched", "baseline"} & failed_arms),
            n_baseline=len(samples.get("baseline", [])), n_patched=len(samples.get("patched", [])),
            ratio=ci.ratio if ci else math.nan, ci_low=ci.low if ci else math.nan, ci_high=ci.high if ci else math.nan,
            min_speedup=config.min_speedup, balance=[b for b in balance or [] if b["workload"] == workload])
        verdicts[workload] = verdict
        for row in rows:
            if row["workload"] == workload and row["arm"] == "patched":
                row["verdict"], row["reasons"] = verdict.verdict, ",".join(verdict.reasons)
        if "patched" not in arms:
            rows.append({"workload": workload, "arm": "patched", "n": 0, "verdict": verdict.verdict,
                         "reasons": ",".join(verdict.reasons), "correct": False})
    return rows, verdicts
