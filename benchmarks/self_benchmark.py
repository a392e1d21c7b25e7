"""e2eprof measuring itself: false-alarm rate, sensitivity, overhead, cost and agreement with other timers.

Each part writes OUT/<part>.parquet (one row per run or measurement) and
OUT/<part>.md (the measured figure, the target, pass or miss, date, versions, command). Rows already in
OUT/<part>.parquet from an earlier run are kept and the figure is derived from all of them, so a part too long for
one sitting (20 A/A runs) can run as several invocations into the same OUT.

  aa           --runs N `e2eprof calibrate` runs (fresh processes)        target: <= 5% significant
  sensitivity  planted slowdowns (--levels), --runs N each, --budget 60 s   target: 1% detected in >= 90% of runs
  overhead     step time bare vs NVML sampler vs sampler + e2eprof's per-step bookkeeping   target: < 0.5%
  cost         default `compare --model gpt2 --patch fastsoftmax` by phases.parquet    target: < 3 min, timing >= half
  agreement    profiled softmax kernel time vs triton do_bench and torch.utils.benchmark, same calls   target: within 5%

Each run is the e2eprof command line (aa and sensitivity run it inside this process, the cost part as its own
`python3 -m e2eprof ...`) and is read back from its Parquet; nothing is installed.
Usage (from the checkout): PYTHONPATH=$PWD python3 benchmarks/self_benchmark.py --part aa --runs 10 --out DIR
CPU dry run: add --model gpt2-tiny --runs 1 --steps 6 (parts that need CUDA record why they were skipped).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import math
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from e2eprof.config import DeviceDefaults, resolve_device
from e2eprof.env import capture_environment
from e2eprof.errors import E2EProfError, UsageError
from e2eprof.tables.rundir import RunDir

PARTS = ("aa", "sensitivity", "overhead", "cost", "agreement")
DEFAULT_LEVELS = (0.005, 0.01, 0.02, 0.05)
UNRESOLVED = "unresolved"  # a figure whose interval spans the target: neither met nor missed
# Fewer runs than these cannot establish a rate (the false-alarm target asks for at least 20 A/A runs): the figure is shown, unjudged.
MIN_AA_RUNS, MIN_SENSITIVITY_RUNS = 20, 10
CONFIDENCE = 0.95
# NOT_DEFAULT: a cost run with a narrower compare (--reference, --workload) measures that option, not the target.
NOT_DEFAULT = "not judged"
MARKS = {True: "met", False: "MISSED", None: "not measured", NOT_DEFAULT: "not judged: not the default compare",
         UNRESOLVED: "not resolved (too few runs, or the interval spans the target)"}  # e2eprof's default policy: significant = interval excludes 1 and adjusted p < 1 - confidence
TARGETS = {
    "aa": "at most 5% of at least 20 A/A runs significant",
    "sensitivity": "a planted 1% slowdown detected (FAIL, SLOWER) in at least 90% of at least 10 runs",
    "overhead": "sampler + bookkeeping cost under 0.5% of step time (the whole 95% interval)",
    "cost": "default compare under 180 s in all, timing at least half of it",
    "agreement": "e2eprof's profiled kernel time within 5% of do_bench and torch.utils.benchmark on the same calls",
}


@dataclass
class Settings:
    """What every part runs with: the model and workload, and the e2eprof options passed through (None: its default)."""

    model: str
    workload: str
    workload_given: bool  # the cost part runs every workload, as the default compare does, unless one was named
    device: str
    out: Path
    runs: int
    deadline_s: float
    steps: int | None
    block_steps: int | None
    batch: int | None
    seq: int | None
    dtype: str | None
    budget: float | None
    replicas: int | None
    command: str
    started: float
    reference: str | None = None  # stock reference arms, as e2eprof's --reference takes them (sdpa, compile, none)
    patch: str | None = None  # aa: the comparison calibrated (e2eprof calibrate's --patch; it must apply to the model)

    def passthrough(self) -> list[str]:
        """The tiny-settings options every e2eprof run of this benchmark gets."""
        args = ["--device", self.device]
        for flag, value in (("--steps", self.steps), ("--block-steps", self.block_steps), ("--batch", self.batch),
                            ("--seq", self.seq), ("--dtype", self.dtype), ("--replicas", self.replicas),
                            ("--reference", self.reference)):
            if value is not None:
                args += [flag, str(value)]
        return args

    def workloads(self) -> list[str]:
        """The workloads --workload names (one, or several comma-separated)."""
        return [w.strip() for w in self.workload.split(",") if w.strip()]

    def options(self) -> str:
        """The passed-through options as text: rows measured with different options are not mixed."""
        return " ".join(self.passthrough() + self.patch_option())

    def patch_option(self) -> list[str]:
        return [] if self.patch is None else ["--patch", self.patch]

    def time_left(self) -> bool:
        """False once --deadline seconds have passed: no new run starts, what ran is written."""
        return time.perf_counter() - self.started < self.deadline_s

    def resolved(self) -> DeviceDefaults:
        """e2eprof's defaults on this device, with the passed-through values applied (for in-process parts)."""
        defaults = DeviceDefaults.for_device(self.device)
        return DeviceDefaults(**{**defaults.__dict__, **{k: v for k, v in (
            ("batch", self.batch), ("seq", self.seq), ("steps", self.steps), ("block_steps", self.block_steps),
            ("precision", self.dtype), ("replicas", self.replicas)) if v is not None}})


# ---- running e2eprof and reading what it wrote ------------------------------------------------------------------

@dataclass
class RunResult:
    run_dir: Path
    command: str
    exit_code: int
    wall_s: float
    error: str  # empty when the run wrote its summary


def run_e2eprof(args: list[str], run_dir: Path, env: dict | None = None, *, fresh_process: bool = False) -> RunResult:
    """One e2eprof command; its output goes to RUN_DIR.log, never to our stdout.

    By default it runs inside this process (e2eprof.cli.main, exactly as `python3 -m e2eprof` would): the arms are
    fresh worker processes either way, and a new interpreter per run would add ~8 s of importing torch and
    transformers on the H200's host to every one of dozens of runs. fresh_process=True runs it as its own process,
    for the cost part, which measures that start-up too. env is set for the run (its workers inherit it).
    """
    argv = [sys.executable, "-m", "e2eprof", *args, "--out", str(run_dir), "--force"]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    shown = " ".join(shlex.quote(a) for a in ["python3", *argv[1:]])
    if env:
        shown = " ".join(f"{k}={v}" for k, v in env.items()) + " " + shown
    start = time.perf_counter()
    with open(f"{run_dir}.log", "w") as log:
        if fresh_process:
            code = subprocess.call(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        else:
            code = _in_process(argv[3:], log, env or {})
    wall = time.perf_counter() - start
    # 0 PASS, 1 FAIL, 3 INCONCLUSIVE are verdicts; 2 (bad input) and 4 (run failed) are not.
    error = "" if code in (0, 1, 3) and (run_dir / "summary.parquet").exists() else f"exit {code}, see {run_dir}.log"
    print(f"  {run_dir.name}: exit {code}, {wall:.1f} s{'  ' + error if error else ''}", flush=True)
    return RunResult(run_dir, shown, code, wall, error)


def _in_process(args: list[str], log, env: dict) -> int:
    """e2eprof.cli.main(args) with its output (both consoles read sys.stdout/sys.stderr when they print) in log."""
    from e2eprof.cli import main as e2eprof_main

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            return e2eprof_main(args)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def signed_row(run_dir: Path, workload: str | None = None) -> pd.Series:
    """The summary row that carries the verdict (the patched arm, or the second baseline of an A/A run), of WORKLOAD
    in a run of several."""
    summary = RunDir(run_dir).read("summary")
    signed = summary[summary.verdict.notna()]
    return (signed if workload is None else signed[signed.workload == workload]).iloc[0]


def verdict_columns(row: pd.Series) -> dict:
    significant = bool((row.ci_low > 1 or row.ci_high < 1) and row.mw_p_adjusted < 1 - CONFIDENCE)
    return {"verdict": row.verdict, "reasons": row.reasons, "speedup": float(row.speedup_vs_baseline),
            "ci_low": float(row.ci_low), "ci_high": float(row.ci_high), "mw_p_adjusted": float(row.mw_p_adjusted),
            "significant": significant, "blocks": int(row.blocks),
            "process_noise": float(row.get("process_noise", math.nan)), "timing_s": float(row.timing_s),
            "processes": int(row["processes"]) if pd.notna(row.get("processes")) else 1,
            "stop_reason": row.stop_reason}


def baseline_median_ms(run_dir: Path, workload: str) -> float:
    summary = RunDir(run_dir).read("summary")
    return float(summary[(summary.arm == "baseline") & (summary.workload == workload)].median_ms.iloc[0])


def failed_row(result: RunResult) -> dict:
    return {"exit_code": result.exit_code, "wall_s": result.wall_s, "error": result.error, "command": result.command}


# ---- the parts ----------------------------------------------------------------------------------------------------

def part_aa(s: Settings, first: int) -> list[dict]:
    """A/A calibration runs, each its own `e2eprof calibrate` (fresh processes); seed = run index.

    --workload may name several (train,infer,decode: what the default compare runs): each run then measures them
    all in the same processes, as a default run does, and gives one row per workload. Runs stay independent of each
    other, so each workload's false-alarm rate is still counted over independent runs, at a third of the device time.
    """
    rows = []
    budget = [] if s.budget is None else ["--budget", str(s.budget)]
    for i in range(first, first + s.runs):
        if not s.time_left():
            break
        result = run_e2eprof(["calibrate", "--model", s.model, "--workload", s.workload, "--seed", str(i),
                              *s.patch_option(), *s.passthrough(), *budget], s.out / "runs" / f"aa-{i:03d}")
        for workload in s.workloads():
            # The process-noise floor this run was judged with (e2eprof's default for the workload), so a floor set
            # from earlier runs is checked only on runs made under it.
            row = {"run": i, "workload": workload, "noise_floor": s.resolved().noise_floor(workload)} | failed_row(result)
            if not result.error:
                row |= verdict_columns(signed_row(result.run_dir, workload))
                row["baseline_median_ms"] = baseline_median_ms(result.run_dir, workload)
            rows.append(row)
    return rows


def softmax_calls_per_step(model: str, workload: str) -> int:
    """How often one step of WORKLOAD calls the planted op: counted on a one-step CPU capture (any batch gives the same)."""
    from e2eprof.microbench.capture import capture_shapes
    from e2eprof.registry import load_patch

    specs = capture_shapes(load_patch("planted-slowdown").patch, model, device="cpu", precision="fp32", batch=1,
                           seq=8, workloads=(workload,))
    return sum(spec.calls_per_step for spec in specs if spec.workload == workload)


def aa_baseline_ms(s: Settings) -> tuple[float | None, str]:
    """The median baseline step of this OUT's A/A runs with the same model, workload and options, if any."""
    path = s.out / "aa.parquet"
    if not path.exists():
        return None, ""
    aa = pd.read_parquet(path)
    same = aa[(aa.model == s.model) & (aa.workload == s.workload) & (aa.e2eprof_options == s.options())
              & (aa.error.fillna("") == "")]
    if not len(same):
        return None, ""
    return float(same.baseline_median_ms.median()), f"median of {len(same)} A/A runs in {path}"


def part_sensitivity(s: Settings, first: int, levels: list[float], baseline_ms: float | None) -> list[dict]:
    """Planted slowdowns of each level: extra device work per softmax call sized from a measured baseline median."""
    if s.workload == "generate":
        raise UsageError("--workload: sensitivity needs train, infer or decode (generate's softmax calls vary with the cache)")
    calls = softmax_calls_per_step(s.model, s.workload)
    baseline_run = ""
    if baseline_ms is None:
        baseline_ms, baseline_run = aa_baseline_ms(s)
    if baseline_ms is None:
        # The baseline's median step from an A/A run of the same settings.
        result = run_e2eprof(["calibrate", "--model", s.model, "--workload", s.workload, *s.passthrough()],
                             s.out / "runs" / f"sensitivity-baseline-{first:03d}")
        if result.error:
            raise E2EProfError(f"the baseline run for the planted delay failed: {result.error}")
        baseline_ms, baseline_run = baseline_median_ms(result.run_dir, s.workload), result.command
    budget = str(60.0 if s.budget is None else s.budget)
    rows = []
    for level in levels:
        delay_us = level * baseline_ms * 1e3 / calls
        for i in range(first, first + s.runs):
            if not s.time_left():
                return rows
            result = run_e2eprof(
                ["compare", "--model", s.model, "--patch", "planted-slowdown", "--workload", s.workload,
                 "--reference", "none", "--no-profile", "--budget", budget, "--seed", str(i), *s.passthrough()],
                s.out / "runs" / f"planted-{level * 100:g}pct-{i:03d}",
                env={"E2EPROF_PLANTED_DELAY_US": f"{delay_us:.3f}"})
            row = {"level": level, "run": i, "delay_us": delay_us, "calls_per_step": calls,
                   "baseline_median_ms": baseline_ms, "baseline_command": baseline_run} | failed_row(result)
            if not result.error:
                row |= verdict_columns(signed_row(result.run_dir))
                row["detected"] = row["verdict"] == "FAIL" and "SLOWER" in str(row["reasons"])
                row["measured_slowdown"] = 1 / row["speedup"] - 1
            rows.append(row)
    return rows


def part_overhead(s: Settings, blocks: int) -> list[dict]:
    """Step time bare, with the NVML sampler, and with the sampler and e2eprof's own per-step bookkeeping.

    Worst case on purpose, as benchmarks/sampler_overhead.py: the sampler thread runs in the stepping process (in
    `compare` it runs in the parent). The bookkeeping is the real thing: ArmWorker.block, which a worker runs for
    every timed block (device-wide synchronize, CUDA events, timestamps). Conditions rotate within each block so
    drift cancels; every step is timed from outside by the same clock.
    """
    import torch

    from e2eprof.trackers.telemetry import open_sampler
    from e2eprof.harness.protocol import ArmSpec, WorkerSetup
    from e2eprof.harness.worker import ArmWorker

    d = s.resolved()
    worker = ArmWorker(WorkerSetup(arm=ArmSpec("baseline", "eager", False), model=s.model, patch_spec="fastsoftmax",
                                   device=s.device, precision=d.precision, seed=0, batch=d.batch, seq=d.seq,
                                   new_tokens=d.new_tokens, scratch_dir=str(s.out / "runs")))
    worker.build()
    # The worker's own workload object and batches, so bare steps run exactly what its timed steps run.
    workload = worker._workload(s.workload)
    device = torch.device(s.device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def bare(i: int) -> None:
        workload.step(worker.batches[i % len(worker.batches)])

    def booked(i: int) -> None:
        worker.block(s.workload, i, 1)

    probe = open_sampler(s.device)
    sampler_note = "" if probe.available else probe.unavailable_reason
    conditions = {"bare": (bare, False), "sampler": (bare, True), "sampler+bookkeeping": (booked, True)}
    for i in range(max(d.max_warmup_steps, 3)):
        bare(i)
    sync()
    rows = []
    names = list(conditions)
    for block in range(blocks):
        for name in names[block % 3:] + names[:block % 3]:
            step, sampling = conditions[name]
            sampler = open_sampler(s.device) if sampling else None
            if sampler is not None and sampler.available:
                sampler.start()
            for k in range(d.block_steps):
                sync()
                t0 = time.perf_counter_ns()
                step(block * d.block_steps + k)
                sync()
                rows.append({"condition": name, "block": block, "step": k,
                             "step_ms": (time.perf_counter_ns() - t0) / 1e6, "sampler_note": sampler_note})
            if sampler is not None and sampler.available:
                sampler.stop()
    return rows


def part_cost(s: Settings) -> list[dict]:
    """The default compare of gpt2 + fastsoftmax, its wall time split by phases.parquet, then `e2eprof report`."""
    budget = [] if s.budget is None else ["--budget", str(s.budget)]
    run_dir = s.out / "runs" / "cost-compare"
    # Every workload unless --workload was given (a CPU dry run keeps to one).
    workload = ["--workload", s.workload] if s.workload_given else []
    result = run_e2eprof(["compare", "--model", s.model, "--patch", "fastsoftmax", *workload, *s.passthrough(),
                          *budget], run_dir, fresh_process=True)
    if result.error:
        return [{"phase": "compare", "phase_workload": "*", "seconds": result.wall_s} | failed_row(result)]
    phases = RunDir(run_dir).read("phases")
    # Each process's first step, summed over workloads: the compile arm's holds its compilations.
    steps = RunDir(run_dir).read("steps")
    cold = steps[(steps.phase == "cold") & (steps.replica.fillna(0) == 0 if "replica" in steps else True)]
    cold = cold.assign(seconds=cold.wall_ns / 1e9)
    cold_by_arm = ", ".join(f"{arm} {sec:.1f} s" for arm, sec in cold.groupby("arm", sort=False).seconds.sum().items())
    # phase_workload, not workload: write() stamps every row with the part's own workload ("all").
    rows = [{"phase": r.phase, "phase_workload": r.workload, "seconds": float(r.seconds)} for r in phases.itertuples()]
    # Start-up is a phase of its own (e2eprof.startup); printing the summary and the process's exit are in none.
    rows.append({"phase": "unattributed (summary printing, exit)", "phase_workload": "*",
                 "seconds": result.wall_s - float(phases.seconds.sum())})
    start = time.perf_counter()
    report = subprocess.run([sys.executable, "-m", "e2eprof", "report", str(run_dir)], capture_output=True, text=True,
                            check=False)
    rows.append({"phase": "report (e2eprof report)", "phase_workload": "*", "seconds": time.perf_counter() - start,
                 "error": "" if report.returncode == 0 else report.stderr.strip()[-300:]})
    return [r | {"exit_code": result.exit_code, "compare_wall_s": result.wall_s, "command": result.command,
                 "cold_by_arm": cold_by_arm, "error": r.get("error", "")} for r in rows]


def profiled_forward_us(ops: pd.DataFrame, kernels: pd.DataFrame, arm: str, workload: str) -> tuple[float, set[str]]:
    """e2eprof's per-call device time of the replaced op's forward in one arm: the median of each kernel that the
    profile attributed to the replaced region's forward ops, summed (one op call launches each of them once)."""
    region = ops[(ops.arm == arm) & (ops.workload == workload) & ops.in_replaced & (ops.direction == "fwd")
                 & (ops.self_device_us > 0)]
    names = set(region.kernels.str.split(";").explode()) - {""}  # ops.parquet joins kernel names with ';'
    mine = kernels[(kernels.arm == arm) & (kernels.workload == workload) & kernels.kernel.isin(names)
                   & kernels.op.isin(set(region.op))]
    return float(mine.median_us.sum()), names


def isolated_profile_us(call, device: str, calls_per_step: int = 20) -> float:
    """e2eprof's own profiler (profiling.profile_workload, the code behind ops/kernels.parquet) on isolated calls of
    the op: per call, each kernel's median launch time, summed. The same calls the independent timers make, so any
    difference between them is the timers', not the loop's."""
    import torch

    from e2eprof.trackers.profiling import profile_workload

    result = profile_workload(lambda: [call() for _ in range(calls_per_step)], torch.nn.Module(),
                              device=torch.device(device), warmup=1, active=3, with_module_ranges=False)
    # Kernels launched once per call of the op (calls counts launches per profiled step).
    return float(sum(k["median_us"] for k in result.kernels if k["calls"] >= calls_per_step))


def phase_sm_clock(run_dir: Path, workload: str, phase: str) -> float:
    """Median SM clock (MHz) the compare run's NVML sampler saw during one of its phases; NaN without telemetry."""
    try:
        telemetry = RunDir(run_dir).read("telemetry")
        phases = RunDir(run_dir).read("phases")
    except (OSError, ValueError):
        return math.nan
    window = phases[(phases.workload == workload) & (phases.phase == phase)]
    if not len(window) or "sm_clock_mhz" not in telemetry:
        return math.nan
    start, end = int(window.start_unix_ns.iloc[0]), int(window.end_unix_ns.iloc[0])
    inside = telemetry[(telemetry.unix_ns >= start) & (telemetry.unix_ns <= end)].sm_clock_mhz.dropna()
    return float(inside.median()) if len(inside) else math.nan


def part_agreement(s: Settings) -> list[dict]:
    """Per-call forward kernel time of the replaced softmax, stock and patched: e2eprof's profiler against two other
    timers on the same calls, and e2eprof's time for the op inside the loop beside them.

    The target is judged on the same calls (e2eprof's profiler on the isolated op, as do_bench and Timer time it):
    that is agreement between timers. The op inside the training step is another measurement: other clocks (a
    whole step draws more power), other cache state. Its difference from the isolated time is the loop's effect,
    which e2eprof exists to show, so it is reported with the SM clock under each, not judged against the timers.
    The independent timers get the op's real inputs: shape, dtype and strides captured from one step of the model
    (GPT-2's softmax input is fp32 under bf16 autocast: the fp32 mask promotes it).
    """
    if not s.device.startswith("cuda"):
        return [{"arm": "-", "status": "skipped", "reason": f"needs CUDA (triton.testing.do_bench); device is {s.device}"}]
    import torch
    import triton.testing
    from torch.utils import benchmark

    from e2eprof.microbench.bench import draw_inputs, op_for
    from e2eprof.microbench.capture import capture_shapes
    from e2eprof.registry import load_patch
    from e2eprof.trackers.telemetry import open_sampler

    run_dir = s.out / "runs" / "agreement-compare"
    result = run_e2eprof(["compare", "--model", s.model, "--patch", "fastsoftmax", "--workload", s.workload,
                          "--reference", "none", "--budget", "0", *s.passthrough()], run_dir)
    if result.error:
        return [{"arm": "-", "status": "failed"} | failed_row(result)]
    ops = RunDir(run_dir).read("ops")
    kernels = RunDir(run_dir).read("kernels")
    loop_clock = phase_sm_clock(run_dir, s.workload, "profile")
    d = s.resolved()
    patch = load_patch("fastsoftmax").patch
    specs = [sp for sp in capture_shapes(patch, s.model, device=s.device, precision=d.precision, batch=d.batch,
                                         seq=d.seq, workloads=(s.workload,)) if sp.workload == s.workload]
    spec = max(specs, key=lambda sp: sp.calls_per_step)  # GPT-2: one softmax shape, called once per layer
    op = op_for(patch, spec)
    inputs = draw_inputs(spec)
    rows = []
    for arm, fn in (("baseline", op.eager), ("patched", op.replacement)):
        def call(fn=fn):
            with torch.no_grad(), spec.context():
                fn(*inputs.args, **inputs.kwargs)

        in_loop_us, names = profiled_forward_us(ops, kernels, arm, s.workload)
        with open_sampler(s.device) as sampler:
            isolated_us = isolated_profile_us(call, s.device)
            do_bench_us = triton.testing.do_bench(call, warmup=50, rep=500, return_mode="median") * 1e3
            timer = benchmark.Timer(stmt="call()", globals={"call": call}).blocked_autorange(min_run_time=2.0)
        clocks = sampler.frame().get("sm_clock_mhz", pd.Series(dtype=float)).dropna()
        timer_us = timer.median * 1e6
        rows.append({"arm": arm, "status": "measured", "shape": spec.signature(), "kernels": "; ".join(sorted(names)),
                     "e2eprof_us": isolated_us, "do_bench_us": do_bench_us, "timer_us": timer_us,
                     "vs_do_bench": isolated_us / do_bench_us - 1, "vs_timer": isolated_us / timer_us - 1,
                     "in_loop_us": in_loop_us, "loop_vs_isolated": in_loop_us / isolated_us - 1,
                     "isolated_sm_clock_mhz": float(clocks.median()) if len(clocks) else math.nan,
                     "loop_sm_clock_mhz": loop_clock, "command": result.command})
    return rows


# ---- figures and markdown -----------------------------------------------------------------------------------------

def binomial_upper(k: int, n: int, confidence: float = 0.95) -> float:
    """Clopper-Pearson one-sided upper bound on a rate seen k times in n (how bad it could still be)."""
    if n == 0 or k >= n:
        return 1.0
    lo, hi = k / n, 1.0
    for _ in range(60):  # bisection on P(X <= k | p) = 1 - confidence
        p = (lo + hi) / 2
        cdf = sum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k + 1))
        lo, hi = (p, hi) if cdf > 1 - confidence else (lo, p)
    return hi


def binomial_lower(k: int, n: int, confidence: float = 0.95) -> float:
    return 1 - binomial_upper(n - k, n, confidence) if n else 0.0


def within_interval(row) -> tuple[float, float]:
    """A run's interval without the process noise its summary folded in (stats.without_process_noise)."""
    from e2eprof.analysis import stats

    noise = getattr(row, "process_noise", math.nan)
    if not (isinstance(noise, float) and noise > 0):
        return row.ci_low, row.ci_high
    within = stats.without_process_noise(stats.RatioCI(row.speedup, row.ci_low, row.ci_high, CONFIDENCE, 0, "stored",
                                                       process_noise=noise))
    return within.low, within.high


def within_halfwidths(runs: pd.DataFrame) -> pd.Series:
    return pd.Series([(hi - lo) / 2 / r.speedup for r in runs.itertuples() for lo, hi in [within_interval(r)]],
                     index=runs.index)


def aa_process_noise(runs: pd.DataFrame) -> float:
    """The process noise A/A runs imply (stats.process_noise_estimate on their within-run intervals); NaN under 3."""
    from e2eprof.analysis import stats

    if len(runs) < 3:
        return math.nan
    intervals = [within_interval(r) for r in runs.itertuples()]
    return stats.process_noise_estimate(runs.speedup, [lo for lo, _ in intervals], [hi for _, hi in intervals],
                                        CONFIDENCE)


def processes_per_arm(runs: pd.DataFrame) -> pd.Series:
    """Processes each arm of a run had (runs from before replicas: 1)."""
    if "processes" not in runs:
        return pd.Series(1, index=runs.index, dtype=int)
    return runs.processes.fillna(1).astype(int)


def aa_significant(runs: pd.DataFrame, process_noise: float) -> pd.Series:
    """Each A/A run judged as e2eprof judges now: its within-run interval widened by PROCESS_NOISE (for one process
    per arm; less for a run with more, stats.replicated_process_noise) excludes 1 and the adjusted Mann-Whitney p is
    under 1 - confidence."""
    from e2eprof.analysis import stats

    judged = []
    for r, processes in zip(runs.itertuples(), processes_per_arm(runs)):
        low, high = within_interval(r)
        noise = stats.replicated_process_noise(process_noise, processes, processes)
        wide = stats.with_process_noise(stats.RatioCI(r.speedup, low, high, CONFIDENCE, 0, "stored"), noise)
        judged.append(bool((wide.low > 1 or wide.high < 1) and r.mw_p_adjusted < 1 - CONFIDENCE))
    return pd.Series(judged, index=runs.index, dtype=bool)


def held_out_runs(runs: pd.DataFrame, default_noise: float, device_noise: float) -> pd.Series:
    """The runs measured with DEFAULT_NOISE in force, so not among those it was set from: those that recorded that
    floor; of runs from before the floor was recorded, those with process noise folded in, and only while the
    default is the device's own (a workload's floor was set from such runs)."""
    legacy = (runs.process_noise.fillna(0) > 0 if "process_noise" in runs else pd.Series(False, index=runs.index)) \
        & (abs(default_noise - device_noise) < 1e-12)
    if "noise_floor" not in runs:
        return legacy
    recorded = runs.noise_floor.notna()
    return (recorded & (runs.noise_floor >= default_noise - 1e-12)) | (~recorded & legacy)


def aa_lines(runs: pd.DataFrame, default_noise: float, processes: int,
             device_noise: float | None = None) -> tuple[int, list[str]]:
    """(significant runs, detail lines) for A/A runs that all had PROCESSES processes per arm; DEFAULT_NOISE is the
    workload's floor, DEVICE_NOISE the device's (the same unless the workload has its own)."""
    n = len(runs)
    judged = aa_significant(runs, default_noise)
    k = int(judged.sum())
    implied = aa_process_noise(runs)
    held_out = held_out_runs(runs, default_noise, default_noise if device_noise is None else device_noise)
    return k, [
        f"- **{processes} process(es) per arm**, {n} runs: verdicts as the tool gave them "
        f"{runs.verdict.value_counts().to_dict()}, {int(runs.significant.sum())} significant (runs from before process "
        f"noise was folded in were judged on their within-run interval)",
        f"  - median within-run interval half-width {within_halfwidths(runs).median() * 100:.2f}%; the spread of their "
        f"ratios beyond their intervals implies process noise {implied * 100:.2f}%"
        + (f", i.e. {implied * math.sqrt(processes) * 100:.2f}% for one process against one" if processes > 1 else ""),
        f"  - judged with process noise {default_noise * 100:.2f}% (the default floor, for one process against one): "
        f"{k} of {n} significant; of the runs measured with a default in force (not used to set it) "
        f"{int(judged[held_out].sum())} of {int(held_out.sum())}"]


def figure(part: str, table: pd.DataFrame, default_noise: float = 0.0, default_replicas: int = 1,
           device_noise: float | None = None) -> tuple[str, bool | None, list[str]]:
    """The part's headline figure, whether it meets the target (None: nothing measured), and detail lines.

    default_noise: the default process-noise floor of the workload, with which A/A runs are judged (see
    aa_significant); device_noise: the device's (default_noise unless the workload has a floor of its own, which
    was set from earlier A/A runs: then only the runs made under it count).
    default_replicas: the processes per arm e2eprof runs by default; the target is judged on the runs made with it,
    runs with other counts are listed below it."""
    ok = table[table.get("error", pd.Series("", index=table.index)).fillna("") == ""] if len(table) else table
    if part == "aa":
        if not len(ok):
            return "no completed A/A run", None, []
        processes = processes_per_arm(ok)
        device_noise = default_noise if device_noise is None else device_noise
        own_floor = abs(default_noise - device_noise) > 1e-12
        detail, k, n = [], 0, 0
        for count in sorted(processes.unique(), key=lambda c: (c != default_replicas, c)):
            runs = ok[processes == count]
            significant, lines = aa_lines(runs, default_noise, int(count), device_noise)
            detail += lines
            if count == default_replicas:
                k, n = significant, len(runs)
                if own_floor:  # the workload's floor was set from earlier runs: only those made under it count
                    held = held_out_runs(runs, default_noise, device_noise)
                    k, n = int(aa_significant(runs[held], default_noise).sum()), int(held.sum())
        if not n:
            return (f"no A/A run with the default {default_replicas} processes per arm"
                    + (" made under the workload's own process-noise floor" if own_floor else ""), None, detail)
        return (f"{k} of {n} A/A runs significant with {default_replicas} process(es) per arm and process noise "
                f"{default_noise * 100:.2f}%" + (" (the workload's own floor; runs made under it)" if own_floor else "")
                + f" ({k / n:.0%}; 95% upper bound {binomial_upper(k, n):.0%})",
                UNRESOLVED if n < MIN_AA_RUNS else k / n <= 0.05, detail)
    if part == "sensitivity":
        if not len(ok):
            return "no completed planted run", None, []
        lines, verdict = [], None
        ok = ok.assign(processes=processes_per_arm(ok))
        for (level, processes), g in ok.groupby(["level", "processes"]):
            k, n = int(g.detected.sum()), len(g)
            lines.append(f"| {level:.1%} | {processes} | {g.delay_us.iloc[0]:.1f} | {n} | {k} | {k / n:.0%} "
                         f"(>= {binomial_lower(k, n):.0%}) | {g.measured_slowdown.median():+.2%} | {g.timing_s.median():.1f} |")
            if math.isclose(level, 0.01) and processes == default_replicas:
                verdict = UNRESOLVED if n < MIN_SENSITIVITY_RUNS else k / n >= 0.9
        one = ok[(ok.level.round(6) == 0.01) & (ok.processes == default_replicas)]
        text = (f"1% detected in {int(one.detected.sum())} of {len(one)} runs with {default_replicas} process(es) per arm"
                if len(one) else f"the 1% level was not run with {default_replicas} process(es) per arm")
        head = [("| planted | processes per arm | delay per call us | runs | detected | rate (95% lower bound) "
                 "| measured slowdown (median) | timed s (median) |"), "|---|---|---|---|---|---|---|---|"]
        return text, verdict, head + lines
    if part == "overhead":
        from e2eprof.analysis import stats

        bare = ok[ok.condition == "bare"]
        lines, verdict = [], None
        for name in ("sampler", "sampler+bookkeeping"):
            cond = ok[ok.condition == name]
            ci = stats.ratio_of_medians_ci(list(bare.step_ms), list(cond.step_ms), baseline_blocks=list(bare.block),
                                           candidate_blocks=list(cond.block))
            cost = 1 / ci.ratio - 1
            lines.append(f"- {name}: median {cond.step_ms.median():.3f} ms vs bare {bare.step_ms.median():.3f} ms: "
                         f"{cost:+.3%} (95% CI [{1 / ci.high - 1:+.3%}, {1 / ci.low - 1:+.3%}])")
            if name == "sampler+bookkeeping":
                # Judged on the interval, not the point estimate: noise must not pass (or fail) the target.
                low, high = 1 / ci.high - 1, 1 / ci.low - 1
                verdict = True if high < 0.005 else False if low > 0.005 else UNRESOLVED
                text = f"sampler + bookkeeping: {cost:+.3%} of step time (95% CI [{low:+.3%}, {high:+.3%}])"
        note = ok.sampler_note.dropna().iloc[0] if ok.sampler_note.dropna().ne("").any() else ""
        if note:
            lines.append(f"- sampler not running: {note}")
        return text, verdict, lines
    if part == "cost":
        if "compare_wall_s" not in table or table.get("error", pd.Series(dtype=str)).fillna("").iloc[0]:
            return "the compare run failed", None, []
        total = float(table.compare_wall_s.iloc[0]) + float(table[table.phase.str.startswith("report")].seconds.sum())
        timing = float(table[table.phase == "timing"].seconds.sum())
        by_phase = table.groupby("phase", sort=False).seconds.sum()
        lines = ["| phase | seconds | share |", "|---|---|---|"] + [
            f"| {p} | {v:.1f} | {v / total:.0%} |" for p, v in by_phase.items()]
        if "phase_workload" in table:
            per_workload = table[table.phase_workload.fillna("*") != "*"].groupby("phase_workload", sort=False).seconds.sum()
            lines.append("- by workload (cold step to profile): " + ", ".join(f"{w} {v:.1f} s" for w, v in per_workload.items()))
        if "cold_by_arm" in table and table.cold_by_arm.notna().any():
            lines.append(f"- cold steps by arm (each arm's first process, every workload): {table.cold_by_arm.dropna().iloc[0]}")
        lines.append("- `e2eprof microbench` is a separate command, not part of compare: not counted here.")
        options = str(table.e2eprof_options.iloc[0]) if "e2eprof_options" in table else ""
        default = "--reference" not in options.split() and table.workload.iloc[0] == "all"
        return (f"{total:.0f} s in all, timing {timing:.0f} s ({timing / total:.0%})",
                (total < 180 and timing >= total / 2) if default else NOT_DEFAULT, lines)
    if part == "agreement":
        measured = table[table.status == "measured"]
        if not len(measured):
            last = table.iloc[-1]
            return f"not measured: {last.get('reason') or last.get('error')}", None, []
        worst = float(measured[["vs_do_bench", "vs_timer"]].abs().max().max())
        lines = ["| arm | kernel | e2eprof us | do_bench us | Timer us | vs do_bench | vs Timer |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {r.arm} | {r.kernels[:60]} | {r.e2eprof_us:.1f} | {r.do_bench_us:.1f} | {r.timer_us:.1f} | "
                  f"{r.vs_do_bench:+.1%} | {r.vs_timer:+.1%} |" for r in measured.itertuples()]
        lines.append(f"- shape: `{measured['shape'].iloc[0]}`")
        if "in_loop_us" in measured:  # rows from before the isolated profile judged the loop's time itself
            lines += ["", "The same op inside the training step (e2eprof's profile of the loop; not judged: the loop "
                      "is another measurement, see part_agreement):", "",
                      "| arm | in the loop us | isolated us | loop vs isolated | SM clock loop / isolated MHz |",
                      "|---|---|---|---|---|"]
            lines += [f"| {r.arm} | {r.in_loop_us:.1f} | {r.e2eprof_us:.1f} | {r.loop_vs_isolated:+.1%} | "
                      f"{r.loop_sm_clock_mhz:.0f} / {r.isolated_sm_clock_mhz:.0f} |" for r in measured.itertuples()]
        return f"largest disagreement {worst:.1%}", worst <= 0.05, lines
    raise ValueError(part)


SOURCE_FOLDERS = ("e2eprof", "workloads", "kernels")


def source_stamp(root: Path = Path(__file__).resolve().parent.parent) -> str:
    """A hash of the measuring code (every .py file of the tool, its workloads and kernels). Rows appended over
    several sittings may come from different code; the hash tells them apart where no git history travels along
    (a GPU machine gets a copy of the working tree, not the repository)."""
    digest = hashlib.sha256()
    for folder in SOURCE_FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def versions(device: str) -> dict:
    env = capture_environment(device)
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "gpu": env.get("gpu_name") or env.get("cpu_model") or "cpu", "python": env["python"], "torch": env["torch"],
            "transformers": env["transformers"], "triton": env["triton"], "source": source_stamp()}


def markdown(part: str, table: pd.DataFrame, default_noise: float = 0.0, default_replicas: int = 1,
             device_noise: float | None = None) -> str:
    text, meets, detail = figure(part, table, default_noise, default_replicas, device_noise)
    mark = MARKS[meets]
    env = "; ".join(f"{k} {', '.join(map(str, table[k].dropna().unique()))}" for k in
                    ("gpu", "python", "torch", "transformers", "triton", "model", "workload", "source")
                    if k in table)
    dates = sorted(table.date.dropna().unique()) if "date" in table else []
    errors = table.error.fillna("") if "error" in table else pd.Series(dtype=str)
    if errors.ne("").any():  # left out of the figure, so say how many and where to look
        failed = errors[errors.ne("")]
        detail = [*detail, f"- runs that failed and are not counted: {len(failed)} (first: {failed.iloc[0]})"]
    return "\n".join([
        f"## {part}", "",
        f"- measured: {text}", f"- target: {TARGETS[part]}: **{mark}**",
        f"- date: {', '.join(dates)}; {env}",
        *[f"- reproduce: `{c}`" for c in table.self_benchmark_command.unique()], "", *detail, ""])


def write(part: str, new_rows: list[dict], s: Settings, keep_old: bool) -> pd.DataFrame:
    """Append this call's rows to OUT/<part>.parquet (earlier calls' rows kept) and rewrite OUT/<part>.md."""
    path = s.out / f"{part}.parquet"
    workload = s.workload if part != "cost" or s.workload_given else "all"
    stamp = versions(s.device) | {"model": s.model, "workload": workload, "e2eprof_options": s.options(),
                                  "self_benchmark_command": s.command}
    frame = pd.DataFrame([stamp | r for r in new_rows])  # a row's own workload (an A/A run of several) wins
    if keep_old and path.exists():
        frame = pd.concat([pd.read_parquet(path), frame], ignore_index=True)
    frame.to_parquet(path, index=False)
    (s.out / f"{part}.md").write_text(markdown_by_workload(part, frame, s.resolved()))
    return frame


def markdown_by_workload(part: str, frame: pd.DataFrame, defaults: DeviceDefaults) -> str:
    """The part's markdown; a table of several workloads (A/A runs over train, infer and decode at once) gets one
    section per workload, each judged with that workload's own floor."""
    workloads = list(frame.workload.unique())  # write() stamps every row with one
    if len(workloads) == 1:
        return markdown(part, frame, defaults.noise_floor(workloads[0]), defaults.replicas, defaults.process_noise)
    sections = [f"## {part}", "",
                f"Runs over {', '.join(workloads)} at once: one row per run and workload, each workload judged on its "
                "own below.", ""]
    for workload in workloads:
        text = markdown(part, frame[frame.workload == workload], defaults.noise_floor(workload), defaults.replicas,
                        defaults.process_noise)
        sections.append(text.replace(f"## {part}\n", f"### {part}: {workload}\n", 1))
    return "\n".join(sections)


def first_run_index(s: Settings, part: str) -> int:
    """Runs continue numbering (and seeds) after those already in OUT/<part>.parquet."""
    path = s.out / f"{part}.parquet"
    if not path.exists():
        return 0
    old = pd.read_parquet(path)
    return int(old.run.max()) + 1 if "run" in old and len(old) else 0


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--part", required=True, choices=PARTS)
    p.add_argument("--runs", type=int, default=10, help="runs in this call (aa), or per level (sensitivity)")
    p.add_argument("--levels", default=",".join(map(str, DEFAULT_LEVELS)), help="planted slowdowns, fractions")
    p.add_argument("--baseline-ms", type=float, help="sensitivity: baseline median step (skips measuring it)")
    # 40 blocks x 5 steps of a ~93 ms H200 step: ~1 min, enough to resolve 0.5% from the interval, not the estimate.
    p.add_argument("--blocks", type=int, default=40, help="overhead: blocks of each condition")
    p.add_argument("--model", default="gpt2")
    p.add_argument("--workload", help="train (default), infer, decode or generate; aa and cost take several, "
                   "comma-separated (aa: one row per run and workload); the cost part runs all workloads unless given")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--deadline", type=float, default=540.0, help="seconds after which no new run starts")
    for flag in ("--steps", "--block-steps", "--batch", "--seq"):
        p.add_argument(flag, type=int, help="passed to every e2eprof run (tiny settings for a dry run)")
    p.add_argument("--dtype")
    p.add_argument("--budget", type=float, help="seconds of timed steps per workload (sensitivity default 60)")
    p.add_argument("--replicas", type=int, help="processes per compared arm, passed to every e2eprof run (default: e2eprof's)")
    # What a faster compare costs: `--part cost --reference sdpa` (no torch.compile arm), `--workload train,infer`.
    p.add_argument("--reference", help="stock reference arms passed to every e2eprof run, e.g. sdpa (default: e2eprof's)")
    p.add_argument("--patch", help="aa: the comparison calibrated, passed to e2eprof calibrate (default: its own, "
                                   "fastsoftmax, which applies to gpt2 only: llama-1b takes rmsnorm or swiglu)")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    a = parse(argv)
    try:
        if a.runs < 1 or a.blocks < 2 or a.deadline <= 0:
            raise UsageError("--runs must be >= 1, --blocks >= 2 and --deadline > 0")
        if a.patch is not None and a.part != "aa":
            raise UsageError(f"--patch: only the aa part takes it (the {a.part} part sets its own patch)")
        if a.reference is not None and a.part != "cost":
            raise UsageError(f"--reference: only the cost part takes it (the {a.part} part sets its own arms)")
        try:
            levels = [float(x) for x in a.levels.split(",")]
        except ValueError:
            raise UsageError(f"--levels: comma-separated fractions such as 0.01,0.02, got {a.levels!r}") from None
        if not all(0 < x < 1 for x in levels):
            raise UsageError(f"--levels: fractions between 0 and 1, got {a.levels!r}")
        if a.workload is not None and "," in a.workload and a.part not in ("aa", "cost"):
            raise UsageError(f"--workload: the {a.part} part measures one workload, got {a.workload!r}")
        a.out.mkdir(parents=True, exist_ok=True)
        s = Settings(model=a.model, workload=a.workload or "train", workload_given=a.workload is not None, device=resolve_device(a.device), out=a.out, runs=a.runs,
                     deadline_s=a.deadline, steps=a.steps, block_steps=a.block_steps, batch=a.batch, seq=a.seq,
                     dtype=a.dtype, budget=a.budget, replicas=a.replicas, reference=a.reference, patch=a.patch, started=time.perf_counter(),
                     command=" ".join(shlex.quote(x) for x in ["python3", "benchmarks/self_benchmark.py", *argv]))
        print(f"self-benchmark {a.part} on {s.device}: {s.model} {s.workload} -> {s.out}", flush=True)
        if a.part == "aa":
            rows, keep = part_aa(s, first_run_index(s, "aa")), True
        elif a.part == "sensitivity":
            rows, keep = part_sensitivity(s, first_run_index(s, "sensitivity"), levels, a.baseline_ms), True
        elif a.part == "overhead":
            rows, keep = part_overhead(s, a.blocks), False
        elif a.part == "cost":
            rows, keep = part_cost(s), False
        else:
            rows, keep = part_agreement(s), False
        if not rows:
            raise E2EProfError("no run started before --deadline")
        write(a.part, rows, s, keep)
        print((s.out / f"{a.part}.md").read_text(), flush=True)
    except E2EProfError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
