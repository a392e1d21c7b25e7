"""`diff`: compare two report directories of the same comparison, e.g. before and after a driver or kernel change.

The two runs are independent samples (different processes, often different days or cards), so nothing is paired
across them: every interval here resamples run A and run B independently. Statistics come from e2eprof.analysis.stats.

Per (workload, arm) present in both runs: median A, median B, the time ratio B/A (above 1: B is slower) with a
bootstrap interval, a Mann-Whitney p-value Holm-adjusted over all those rows, and a status. Per workload: the
kernel's speedup (baseline / patched median) in A and in B, and the interval of their difference. Every interval is
widened by the runs' process noise (stats.with_process_noise; a run from before the setting gets its device's
default): A and B ran in other processes, and identical processes differ (H200: ~0.44% of a gpt2 step).

Sweeps: when either run covers several (batch, seq, precision) points, rows are keyed by (point, workload, arm) and
numbers of different points are never pooled. Runs whose grids share no point are not the same comparison; runs
whose grids overlap are diffed on the common points and the rest is flagged. An arm that fitted in A but ran out of
memory in B is a regression (OUT_OF_MEMORY_IN_B).

A change counts only when it is significant (Holm-adjusted p <= 1 - confidence and the interval excludes "no
change") and its whole interval lies beyond the margin ``min_change``, the same rule `compare` uses for PASS; a
significant change whose interval reaches inside the margin is BELOW_MARGIN. Exit code 1 when anything got worse
that way, else 0.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from e2eprof.tables import reports
from e2eprof.analysis import stats
from e2eprof.config import DeviceDefaults
from e2eprof.errors import UsageError
from e2eprof.tables.rundir import RunDir
from e2eprof.distributed.ranks import slowest_rank_frame
from e2eprof.sweep import OOM_METRIC, SweepPoint
from e2eprof.analysis.verdict import MIN_SAMPLES

METRICS = {"wall": "host wall time per step", "device": "CUDA-event device time per step"}

# Row statuses (stable strings: CI pipelines may match on them).
SLOWER, FASTER = "SLOWER", "FASTER"
SPEEDUP_DROPPED, SPEEDUP_GREW = "SPEEDUP_DROPPED", "SPEEDUP_GREW"
NO_SIGNIFICANT_DIFFERENCE, BELOW_MARGIN = "NO_SIGNIFICANT_DIFFERENCE", "BELOW_MARGIN"
TOO_FEW_SAMPLES, ONLY_IN_A, ONLY_IN_B = "TOO_FEW_SAMPLES", "ONLY_IN_A", "ONLY_IN_B"
OUT_OF_MEMORY_IN_A, OUT_OF_MEMORY_IN_B = "OUT_OF_MEMORY_IN_A", "OUT_OF_MEMORY_IN_B"
REGRESSIONS = (SLOWER, SPEEDUP_DROPPED, OUT_OF_MEMORY_IN_B)

# Environment entries worth naming when they differ, with the label shown to the user.
ENVIRONMENT_FIELDS = (
    ("torch", "torch"), ("torch_cuda", "CUDA (torch build)"), ("transformers", "transformers"), ("triton", "triton"),
    ("driver", "driver"), ("gpu_name", "GPU"), ("gpu_uuid", "GPU UUID (another physical card)"),
    ("gpu_capability", "GPU capability"), ("cpu_model", "CPU"), ("cpu_count", "CPU count"),
    ("torch_threads", "torch threads"), ("python", "python"), ("numpy", "numpy"), ("platform", "platform"),
)
# Settings that change sample sizes or inputs but not what is compared: named as changes, never refused.
SETTING_FIELDS = ("steps", "block_steps", "seed", "reference_arms", "warmup_tolerance", "max_warmup_steps",
                  "max_warmup_seconds", "target_half_width", "budget_seconds", "max_blocks", "confidence", "min_speedup")
# Same tolerance as the arm-balance check inside one run (telemetry.arm_balance): below it clocks count as equal.
CLOCK_TOLERANCE = 0.02


@dataclass(frozen=True)
class DiffConfig:
    """What `diff` compares and how; validated on construction, errors name the option."""

    run_a: Path
    run_b: Path
    out: Path | None = None  # default: RUN_B/diff-vs-<RUN_A name>/
    min_change: float = 0.01  # relative time for arm rows; speedup points (1.05x -> 1.04x is 0.01) for speedup rows
    metric: str = "wall"
    allow_different: bool = False
    confidence: float = 0.95
    n_boot: int = 2000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise UsageError(f"--metric: unknown metric '{self.metric}'; known: {', '.join(METRICS)}")
        if not 0 <= self.min_change < 1:
            raise UsageError(f"--min-change: must be a fraction in [0, 1) such as 0.01, got {self.min_change}")
        if not 0.5 < self.confidence < 1:
            raise UsageError(f"confidence: must be between 0.5 and 1, got {self.confidence}")

    @property
    def alpha(self) -> float:
        return 1.0 - self.confidence

    @property
    def out_dir(self) -> Path:
        return Path(self.out) if self.out else Path(self.run_b) / f"diff-vs-{Path(self.run_a).resolve().name}"


@dataclass
class RunRecord:
    """One report directory as `diff` needs it: the run row, its config and environment, the warm steps."""

    label: str  # "A" or "B"
    path: Path
    run: dict
    config: dict
    environment: dict
    model: dict
    warm: pd.DataFrame  # steps with phase == "warm": the timed samples, never cold or warm-up steps
    summary: pd.DataFrame | None
    # Sweep points in the order the run measured them. Every warm and summary row carries a `point` (a run from
    # before sweeps gets its config's one point), so one lookup serves sweeps and single runs alike.
    points: list[str] = field(default_factory=list)
    out_of_memory: set[tuple[str, str, str]] = field(default_factory=set)  # (point, workload, arm)

    @property
    def workloads(self) -> list[str]:
        return list(dict.fromkeys(self.warm.workload))

    def arms(self, point: str, workload: str) -> list[str]:
        rows = self.warm[(self.warm.point == point) & (self.warm.workload == workload)]
        return list(dict.fromkeys(rows.arm))

    def _rows(self, point: str, workload: str, arm: str) -> pd.DataFrame:
        return self.warm[(self.warm.point == point) & (self.warm.workload == workload) & (self.warm.arm == arm)]

    def samples(self, point: str, workload: str, arm: str, metric: str) -> np.ndarray:
        """Timed samples of one arm at one point in ms; device time leaves out steps without a CUDA-event reading."""
        rows = self._rows(point, workload, arm)
        values = rows.wall_ns.to_numpy(dtype=float) / 1e6 if metric == "wall" else rows.device_ms.to_numpy(dtype=float)
        return values[np.isfinite(values)]

    def blocks(self, point: str, workload: str, arm: str, metric: str) -> np.ndarray:
        """Block index of each sample returned by `samples`, in the same order."""
        rows = self._rows(point, workload, arm)
        values = rows.wall_ns.to_numpy(dtype=float) if metric == "wall" else rows.device_ms.to_numpy(dtype=float)
        return rows.block.to_numpy()[np.isfinite(values)]

    def processes(self, point: str, workload: str, arm: str) -> int:
        """How many processes the arm's timed samples came from (replicas); runs from before replicas had one."""
        return stats.count_processes(self._rows(point, workload, arm).get("replica"))

    @property
    def process_noise(self) -> float:
        """The spread between identical processes this run was judged with: its own setting, or its device's default
        for a run from before the setting existed (the offsets were there all the same)."""
        value = self.config.get("process_noise")
        if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0:
            return float(value)
        return DeviceDefaults.for_device(str(self.config.get("device") or "cpu")).process_noise

    def relabelled(self, label: str) -> RunRecord:
        """The same run with its one point renamed (two single-point runs are diffed row against row)."""
        summary = self.summary.assign(point=label) if self.summary is not None else None
        return dataclasses.replace(self, warm=self.warm.assign(point=label), summary=summary, points=[label],
                                   out_of_memory={(label, w, a) for _, w, a in self.out_of_memory})


def load_run(path: Path, label: str) -> RunRecord:
    """Read a `compare` report directory; UsageError when it is not one."""
    path = Path(path)
    name = f"RUN_{label}"
    if not path.is_dir():
        raise UsageError(f"{name}: {path} is not a directory")
    run_dir = RunDir(path)
    for table in ("run", "steps"):
        if not run_dir.has(table):
            raise UsageError(f"{name}: {path} is not an e2eprof report directory (no {table}.parquet)")
    try:
        run = run_dir.run_row()
        steps = run_dir.read("steps")
        summary = run_dir.read_if_present("summary")
        checks = run_dir.read_if_present("correctness")
        config = json.loads(run["config_json"])
        environment = json.loads(run["environment_json"])
        model = json.loads(run["model_json"]) if isinstance(run.get("model_json"), str) else {}
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise UsageError(f"{name}: cannot read the report in {path}: {exc}") from None
    own = config_point(config)
    warm = steps[steps.phase == "warm"] if len(steps) else steps
    warm = _with_point(slowest_rank_frame(warm), own)  # a data-parallel step lasts as long as its slowest rank
    summary = _with_point(summary, own) if summary is not None else None
    out_of_memory = set()
    if checks is not None and len(checks) and "metric" in checks:
        oom = _with_point(checks[checks.metric == OOM_METRIC], own)
        out_of_memory = set(zip(oom.point.astype(str), oom.workload.astype(str), oom.arm.astype(str)))
    return RunRecord(label, path, run, config, environment, model or {}, warm, summary,
                     _points(run, warm, summary, own), out_of_memory)


def config_point(config: dict) -> str:
    """The point id of a run of one point, from its config (a run from before sweeps has no point column)."""
    try:
        return SweepPoint(int(config["batch"]), int(config["seq"]), str(config["precision"])).id
    except (KeyError, TypeError, ValueError):  # a list (a sweep) or a field this run did not record
        return "-"


def _with_point(frame: pd.DataFrame, point: str) -> pd.DataFrame:
    if "point" in frame:
        return frame.assign(point=frame.point.fillna(point).astype(str))
    return frame.assign(point=point)


def _points(run: dict, warm: pd.DataFrame, summary: pd.DataFrame | None, own: str) -> list[str]:
    """run.parquet's points_json (it lists points where nothing ran too), else the points the tables name."""
    listed = []
    if isinstance(run.get("points_json"), str):
        try:
            listed = [str(p["point"]) for p in json.loads(run["points_json"])]
        except (ValueError, KeyError, TypeError):
            listed = []
    found = listed + list(warm.point) + (list(summary.point) if summary is not None else [])
    return list(dict.fromkeys(found)) or [own]


# ----------------------------------------------------------------------------------------------------------------
# is it the same comparison, and what changed


def _spec_name(spec) -> str:
    """A model or patch spec without its folder: the same patch file copied elsewhere is the same patch."""
    return str(spec).rstrip("/").rsplit("/", 1)[-1]


def comparison_identity(run: RunRecord, with_generate: bool) -> dict:
    """The fields that must match for two runs to measure the same thing."""
    c = run.config
    identity = {
        "model": _spec_name(c.get("model")), "patch": _spec_name(c.get("patch")), "batch": _axis(c.get("batch")),
        "seq": _axis(c.get("seq")), "dtype": _axis(c.get("precision")), "device": str(c.get("device", "")).split(":")[0],
        "A/A run": bool(c.get("aa", False)),  # a baseline timed against itself is not the patched comparison
    }
    # A local model folder is named by path only; its shape tells whether the two names hold the same model.
    for key in ("architecture", "n_layer", "n_params", "vocab_size"):
        identity[f"model {key}"] = run.model.get(key)
    if with_generate:  # new_tokens only shapes the decoding workloads
        identity["new_tokens"] = c.get("new_tokens")
    return identity


def _axis(value) -> str | None:
    """A sweep axis as written on the command line: 8, or 1,8,32 for a list."""
    if value is None:
        return None
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def identity_differences(a: RunRecord, b: RunRecord) -> list[str]:
    """'field: A vs B' for each identity field that differs (a field missing from one run's records is skipped).

    The grid counts as the same comparison while the two runs share at least one point: the common points are
    diffed and the others flagged (see point_flags). Grids with no point in common measure different shapes.
    """
    with_generate = any(w in a.workloads and w in b.workloads for w in ("decode", "generate"))
    ia, ib = comparison_identity(a, with_generate), comparison_identity(b, with_generate)
    shared_point = bool(set(a.points) & set(b.points))
    grid = ("batch", "seq", "dtype") if shared_point else ()
    return [f"{k}: {ia[k]} vs {ib[k]}" for k in ia
            if k not in grid and ia[k] is not None and ib[k] is not None and ia[k] != ib[k]]


def _short(value) -> str:
    return "unset" if value is None else str(value)


def _median_column(run: RunRecord, column: str) -> float:
    if column not in run.warm or not run.warm[column].notna().any():
        return math.nan
    return float(run.warm[column].median())


def environment_changes(a: RunRecord, b: RunRecord) -> list[str]:
    """Short lines naming what differs between the runs besides the kernel itself: versions, card, clocks, inputs."""
    changes = []
    for key, label in ENVIRONMENT_FIELDS:
        va, vb = a.environment.get(key), b.environment.get(key)
        if va != vb:
            changes.append(f"{label}: {_short(va)} -> {_short(vb)}")
    vars_a, vars_b = a.environment.get("env_vars") or {}, b.environment.get("env_vars") or {}
    for name in sorted(set(vars_a) | set(vars_b)):
        if vars_a.get(name) != vars_b.get(name):
            changes.append(f"env {name}: {_short(vars_a.get(name))} -> {_short(vars_b.get(name))}")
    sha_a, sha_b = a.run.get("patch_source_sha256"), b.run.get("patch_source_sha256")
    if sha_a != sha_b:
        changes.append(f"patch source sha256: {_short(sha_a)[:12]} -> {_short(sha_b)[:12]}")
    if a.run.get("batch_digest") != b.run.get("batch_digest"):
        changes.append(f"input batch digest: {_short(a.run.get('batch_digest'))[:12]} -> {_short(b.run.get('batch_digest'))[:12]}")
    for key in SETTING_FIELDS:
        if a.config.get(key) != b.config.get(key):
            changes.append(f"{key.replace('_', '-')}: {_short(a.config.get(key))} -> {_short(b.config.get(key))}")
    clock_a, clock_b = _median_column(a, "sm_clock_median_mhz"), _median_column(b, "sm_clock_median_mhz")
    if math.isnan(clock_a) != math.isnan(clock_b):
        changes.append(f"SM clock telemetry: {'none' if math.isnan(clock_a) else f'{clock_a:.0f} MHz'} -> "
                       f"{'none' if math.isnan(clock_b) else f'{clock_b:.0f} MHz'}")
    elif not math.isnan(clock_a) and abs(clock_b / clock_a - 1) > CLOCK_TOLERANCE:
        changes.append(f"SM clock (median of warm steps): {clock_a:.0f} -> {clock_b:.0f} MHz ({(clock_b / clock_a - 1) * 100:+.1f}%)")
    return changes


def _verdict_text(run: RunRecord, point: str, workload: str) -> str | None:
    if run.summary is None or "verdict" not in run.summary:
        return None
    rows = run.summary[(run.summary.point == point) & (run.summary.workload == workload) & (run.summary.arm == "patched")]
    if not len(rows) or not isinstance(rows.iloc[0].verdict, str):
        return None
    reasons = rows.iloc[0].get("reasons")
    return f"{rows.iloc[0].verdict} ({reasons})" if isinstance(reasons, str) and reasons else rows.iloc[0].verdict


def run_flags(a: RunRecord, b: RunRecord, metric: str) -> list[str]:
    """Things a reader should know that do not stop the diff: partial runs, verdicts that changed, throttling."""
    flags = []
    for run in (a, b):
        if run.run.get("status") != "complete":
            flags.append(f"RUN_NOT_COMPLETE: run {run.label} has status '{run.run.get('status')}'")
        if "throttled" in run.warm and run.warm.throttled.fillna(False).astype(bool).any():
            share = run.warm.throttled.fillna(False).astype(bool).mean()
            flags.append(f"THROTTLED: {share * 100:.0f}% of run {run.label}'s timed steps were throttled")
        if metric == "device" and not run.warm.device_ms.notna().any():
            flags.append(f"NO_DEVICE_TIME: run {run.label} recorded no device times (CPU run?); its rows are empty")
    sweep = is_sweep(a, b)
    for workload in dict.fromkeys(a.workloads + b.workloads):
        if workload not in b.workloads:
            flags.append(f"{ONLY_IN_A}: workload '{workload}' was run only in A")
        elif workload not in a.workloads:
            flags.append(f"{ONLY_IN_B}: workload '{workload}' was run only in B")
    for point in common_points(a, b):
        for workload in [w for w in a.workloads if w in b.workloads]:
            va, vb = _verdict_text(a, point, workload), _verdict_text(b, point, workload)
            if va and vb and va != vb:
                flags.append(f"VERDICT_CHANGED: {_key(sweep, point, workload)}: {va} in A, {vb} in B")
    return flags + point_flags(a, b)


def is_sweep(a: RunRecord, b: RunRecord) -> bool:
    """Rows need a point to be told apart when either run covers more than one."""
    return len(a.points) > 1 or len(b.points) > 1


def common_points(a: RunRecord, b: RunRecord) -> list[str]:
    return [p for p in a.points if p in b.points]


def _key(sweep: bool, point: str, *names: str) -> str:
    """'infer/patched', or 'b8-s1024-bf16/infer/patched' in a sweep."""
    return "/".join(([point] if sweep else []) + list(names))


def point_flags(a: RunRecord, b: RunRecord) -> list[str]:
    """Points in one grid only (diffed nowhere), and (point, workload)s where an arm ran out of memory."""
    flags = []
    if a.points != b.points and is_sweep(a, b):
        flags.append(f"DIFFERENT_GRID: A has {len(a.points)} point(s), B {len(b.points)}; "
                     f"{len(common_points(a, b))} in common are diffed")
    flags += [f"{ONLY_IN_A}: point '{p}' was run only in A" for p in a.points if p not in b.points]
    flags += [f"{ONLY_IN_B}: point '{p}' was run only in B" for p in b.points if p not in a.points]
    sweep = is_sweep(a, b)
    for point, workload in dict.fromkeys((p, w) for p, w, _ in sorted(a.out_of_memory | b.out_of_memory)):
        where = [f"{', '.join(sorted(arm for p, w, arm in run.out_of_memory if (p, w) == (point, workload)))} in {run.label}"
                 for run in (a, b) if any((p, w) == (point, workload) for p, w, _ in run.out_of_memory)]
        flags.append(f"OUT_OF_MEMORY: {_key(sweep, point, workload)}: {'; '.join(where)}")
    return flags


# ----------------------------------------------------------------------------------------------------------------
# statistics


def _significant(low: float, high: float, p_adjusted: float, alpha: float, no_change: float) -> bool:
    """Both tests agree: the adjusted p-value is small and the interval leaves out "no change"."""
    return p_adjusted <= alpha and (low > no_change or high < no_change)


def arm_status(low: float, high: float, p_adjusted: float, alpha: float, min_change: float) -> str:
    """Status of a time ratio B/A. Its direction comes from the interval, which lies wholly on one side of 1."""
    if not _significant(low, high, p_adjusted, alpha, 1.0):
        return NO_SIGNIFICANT_DIFFERENCE
    if low > 1.0:
        return SLOWER if low > 1.0 + min_change else BELOW_MARGIN
    # Faster beyond the margin mirrors slower beyond it: A/B above 1 + m, i.e. B/A below 1 / (1 + m).
    return FASTER if high < 1.0 / (1.0 + min_change) else BELOW_MARGIN


def speedup_status(low: float, high: float, p_adjusted: float, alpha: float, min_change: float) -> str:
    """Status of a speedup difference B - A (in speedup points: 1.05x -> 1.04x is -0.01)."""
    if not _significant(low, high, p_adjusted, alpha, 0.0):
        return NO_SIGNIFICANT_DIFFERENCE
    if high < 0.0:
        return SPEEDUP_DROPPED if high < -min_change else BELOW_MARGIN
    return SPEEDUP_GREW if low > min_change else BELOW_MARGIN


def arm_rows(a: RunRecord, b: RunRecord, config: DiffConfig) -> list[dict]:
    """One row per (point, workload, arm) in either run; both-run rows carry B/A, its interval and Holm-adjusted p."""
    rows = []
    for point in dict.fromkeys(a.points + b.points):
        for workload in dict.fromkeys(a.workloads + b.workloads):
            arms_a, arms_b = a.arms(point, workload), b.arms(point, workload)
            for arm in dict.fromkeys(arms_a + arms_b):
                rows.append(_arm_row(a, b, config, point, workload, arm, arm in arms_a, arm in arms_b))
    _holm_into(rows)
    for row in rows:
        if row["status"] is None:
            row["status"] = arm_status(row["ci_low"], row["ci_high"], row["p_adjusted"], config.alpha, config.min_change)
    return rows


def _arm_row(a, b, config, point, workload, arm, in_a: bool, in_b: bool) -> dict:
    xa, xb = a.samples(point, workload, arm, config.metric), b.samples(point, workload, arm, config.metric)
    row = {"kind": "arm", "point": point, "workload": workload, "arm": arm, "n_a": len(xa), "n_b": len(xb),
           "median_a_ms": float(np.median(xa)) if len(xa) else math.nan,
           "median_b_ms": float(np.median(xb)) if len(xb) else math.nan,
           "ratio": math.nan, "ci_low": math.nan, "ci_high": math.nan, "mde": math.nan, "p": math.nan, "status": None}
    if not in_b:
        row["status"] = OUT_OF_MEMORY_IN_B if (point, workload, arm) in b.out_of_memory else ONLY_IN_A
    elif not in_a:
        row["status"] = OUT_OF_MEMORY_IN_A if (point, workload, arm) in a.out_of_memory else ONLY_IN_B
    elif min(len(xa), len(xb)) < 2:
        row["status"] = TOO_FEW_SAMPLES  # a bootstrap of one sample would be a false certainty
    else:
        # ratio_of_medians_ci divides median(baseline) by median(candidate): B first gives B/A, a time ratio.
        ci = stats.ratio_of_medians_ci(xb, xa, confidence=config.confidence, n_boot=config.n_boot, seed=config.seed)
        # A and B are other processes: each one's own offset is a difference the bootstrap cannot see.
        # Differences between days or cards come on top and are not in it: the environment flags name them.
        noise = stats.pooled_process_noise(a.process_noise, a.processes(point, workload, arm),
                                           b.process_noise, b.processes(point, workload, arm))
        ci = stats.with_process_noise(ci, noise)
        row.update(ratio=ci.ratio, ci_low=ci.low, ci_high=ci.high, mde=stats.minimum_detectable_effect(ci),
                   p=stats.mann_whitney(xb, xa).p_two_sided, process_noise=noise)
    return row


def _holm_into(rows: list[dict]) -> None:
    """Holm-adjust the rows' p-values as one family; rows without a test get NaN."""
    tested = [r for r in rows if not math.isnan(r["p"])]
    for row, adjusted in zip(tested, stats.holm([r["p"] for r in tested])):
        row["p_adjusted"] = adjusted
    for row in rows:
        row.setdefault("p_adjusted", math.nan)


def speedup_rows(a: RunRecord, b: RunRecord, config: DiffConfig) -> list[dict]:
    """Per (point, workload) in both runs: the kernel's speedup (baseline / patched median) in A and in B, and B - A."""
    rows = []
    units = [(p, w) for p in common_points(a, b) for w in a.workloads if w in b.workloads]
    sweep = is_sweep(a, b)
    for point, workload in units:
        per_run, replicates = {}, {}
        # One generator per (point, workload), seeded by its name, so its numbers do not depend on the others.
        rng = np.random.default_rng([config.seed, zlib.crc32(_key(sweep, point, workload).encode())])
        for run in (a, b):
            base, patched = (run.samples(point, workload, arm, config.metric) for arm in ("baseline", "patched"))
            if min(len(base), len(patched)) < 2:
                break
            # Within a run, the same interval `compare` reports (block-paired when there are enough blocks).
            per_run[run.label] = stats.ratio_of_medians_ci(
                base, patched, baseline_blocks=run.blocks(point, workload, "baseline", config.metric),
                candidate_blocks=run.blocks(point, workload, "patched", config.metric), confidence=config.confidence,
                n_boot=config.n_boot, seed=config.seed)
            # Across runs nothing pairs, so each run's arms are resampled independently (stats' own resampler).
            replicates[run.label] = stats._independent_bootstrap(base, patched, config.n_boot, rng)
        if len(per_run) < 2:
            continue  # an arm is missing or nearly empty: its arm row already says so
        diff = replicates["B"] - replicates["A"]
        low, high = np.quantile(diff, [config.alpha / 2, 1 - config.alpha / 2])
        # Two-sided bootstrap p: the share of replicates on the far side of 0, with +1 so it is never exactly 0.
        p = min(1.0, 2 * (min(np.sum(diff <= 0), np.sum(diff >= 0)) + 1) / (config.n_boot + 1))
        # Each run's speedup carries its own process noise, as `compare` reports it; the difference carries both,
        # added in quadrature to each side of the bootstrap interval (absolute speedup units: ratio x noise).
        noise = {run.label: stats.replicated_process_noise(run.process_noise, run.processes(point, workload, "baseline"),
                                                           run.processes(point, workload, "patched")) for run in (a, b)}
        per_run = {label: stats.with_process_noise(ci, noise[label]) for label, ci in per_run.items()}
        sa, sb = per_run["A"], per_run["B"]
        spread = stats.process_noise_half_width(math.hypot(sa.ratio * noise["A"], sb.ratio * noise["B"]), config.confidence)
        point_diff = sb.ratio - sa.ratio
        low = point_diff - math.hypot(max(point_diff - low, 0.0), spread)
        high = point_diff + math.hypot(max(high - point_diff, 0.0), spread)
        rows.append({"kind": "speedup", "point": point, "workload": workload, "arm": "patched",
                     "speedup_a": sa.ratio, "speedup_a_low": sa.low, "speedup_a_high": sa.high,
                     "speedup_b": sb.ratio, "speedup_b_low": sb.low, "speedup_b_high": sb.high,
                     "diff": sb.ratio - sa.ratio, "diff_low": float(low), "diff_high": float(high), "p": p})
    _holm_into(rows)
    for row in rows:
        row["status"] = speedup_status(row["diff_low"], row["diff_high"], row["p_adjusted"], config.alpha, config.min_change)
    return rows


# ----------------------------------------------------------------------------------------------------------------
# the result, its files and its table


@dataclass
class RunDiff:
    """What `diff_runs` returns: both runs, what changed between them, flags, the rows, where they were written."""

    config: DiffConfig
    run_a: RunRecord
    run_b: RunRecord
    changes: list[str]
    flags: list[str]
    rows: pd.DataFrame
    out_dir: Path | None = None
    different_comparison: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> pd.DataFrame:
        return self.rows[self.rows.status.isin(REGRESSIONS)]

    @property
    def exit_code(self) -> int:
        return 1 if len(self.regressions) else 0

    @property
    def sweep(self) -> bool:
        return is_sweep(self.run_a, self.run_b)


def diff_runs(config: DiffConfig, write: bool = True) -> RunDiff:
    """Compare RUN_B against RUN_A (see module docstring) and write diff.parquet and diff.md unless write=False."""
    a, b = load_run(config.run_a, "A"), load_run(config.run_b, "B")
    different = identity_differences(a, b)
    if not is_sweep(a, b):
        # One point each: row against row, as before sweeps (under --allow-different the two points may differ).
        label = a.points[0] if a.points == b.points else f"{a.points[0]} | {b.points[0]}"
        a, b = a.relabelled(label), b.relabelled(label)
    if different and not config.allow_different:
        raise UsageError(f"RUN_A and RUN_B are not the same comparison ({'; '.join(different)}); "
                         "use --allow-different to diff them anyway")
    if config.metric == "device" and not (a.warm.device_ms.notna().any() and b.warm.device_ms.notna().any()):
        raise UsageError("--metric device: a run has no device times (CPU runs record none); use --metric wall")
    flags = [f"DIFFERENT_COMPARISON: {d}" for d in different] + run_flags(a, b, config.metric)
    arms = arm_rows(a, b, config)
    sweep = is_sweep(a, b)
    few = [_key(sweep, r["point"], r["workload"], r["arm"]) for r in arms if 0 < min(r["n_a"], r["n_b"]) < MIN_SAMPLES]
    if few:  # same threshold as compare's TOO_FEW_SAMPLES: intervals from so few medians are lumpy
        flags.append(f"FEW_SAMPLES: under {MIN_SAMPLES} timed steps in a run for {', '.join(few)}; intervals are rough")
    rows = pd.DataFrame(arms + speedup_rows(a, b, config))
    result = RunDiff(config, a, b, environment_changes(a, b), flags, rows, different_comparison=different)
    if write:
        write_diff(result)
    return result


def write_diff(result: RunDiff) -> Path:
    """diff.parquet (one row per workload/arm, then speedup rows; run-level facts as constant columns) and diff.md."""
    out = result.config.out_dir
    c = result.config
    frame = result.rows.assign(
        run_a=str(result.run_a.path), run_b=str(result.run_b.path), run_a_id=result.run_a.run.get("run_id"),
        run_b_id=result.run_b.run.get("run_id"), metric=c.metric, min_change=c.min_change, confidence=c.confidence,
        changes_json=reports.to_json(result.changes), flags_json=reports.to_json(result.flags))
    reports.write_table(out, "diff", frame)
    _write_text_atomic(out / "diff.md", to_markdown(result))
    result.out_dir = out
    return out


def _write_text_atomic(path: Path, text: str) -> None:
    """Same pattern as reports.write_table: a temporary name in the same folder, then a rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _num(value, spec: str = ".2f") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def _interval(value, low, high, spec: str = ".3f", suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:{spec}}{suffix} [{low:{spec}}, {high:{spec}}]"


def _cells(result: RunDiff) -> tuple[list[str], list[list[str]], list[str], list[list[str]]]:
    """Header and cells of the two tables, shared by the terminal and the markdown file (a point column in a sweep)."""
    sweep = result.sweep
    lead = ["point"] if sweep else []
    arm_header = [*lead, "workload", "arm", "n A/B", "median A ms", "median B ms", "B/A [CI]", "p (Holm)", "status"]
    arm_cells = [[*([r.point] if sweep else []), r.workload, r.arm, f"{r.n_a:.0f}/{r.n_b:.0f}", _num(r.median_a_ms),
                  _num(r.median_b_ms), _interval(r.ratio, r.ci_low, r.ci_high), _num(r.p_adjusted, ".3g"), r.status]
                 for r in result.rows[result.rows.kind == "arm"].itertuples()]
    speed_header = [*lead, "workload", "speedup A [CI]", "speedup B [CI]", "B - A [CI]", "p (Holm)", "status"]
    speed_cells = [[*([r.point] if sweep else []), r.workload,
                    _interval(r.speedup_a, r.speedup_a_low, r.speedup_a_high, suffix="x"),
                    _interval(r.speedup_b, r.speedup_b_low, r.speedup_b_high, suffix="x"),
                    _interval(r.diff, r.diff_low, r.diff_high, spec="+.3f"), _num(r.p_adjusted, ".3g"), r.status]
                   for r in result.rows[result.rows.kind == "speedup"].itertuples()]
    return arm_header, arm_cells, speed_header, speed_cells


def outcome(result: RunDiff) -> str:
    """One line: what got worse (exit 1) or that nothing did (exit 0)."""
    worse = [f"{_key(result.sweep, r.point, r.workload, r.arm)} {r.status}" for r in result.regressions.itertuples()]
    if worse:
        return f"REGRESSION: {', '.join(worse)} (beyond --min-change {result.config.min_change:g}; exit 1)"
    return f"no significant regression beyond --min-change {result.config.min_change:g} (exit 0)"


def _method_line(result: RunDiff) -> str:
    c = result.config
    n_tests = int(result.rows.p_adjusted.notna().sum()) if len(result.rows) else 0
    noise = ", ".join(dict.fromkeys(f"{run.process_noise:.2%}" for run in (result.run_a, result.run_b)))
    return (f"metric: {METRICS[c.metric]} (ms). B/A above 1: B slower. {c.confidence:.0%} bootstrap intervals, the two "
            f"runs resampled independently and widened by their process noise ({noise} for one process against "
            f"one: A and B ran in other processes); Mann-Whitney (arms) and bootstrap (speedups) p-values "
            f"Holm-adjusted per table ({n_tests} tests); speedup = baseline / patched median, the interval within a "
            f"run as `compare` computes it.")


def to_markdown(result: RunDiff) -> str:
    """diff.md: the same content as the terminal output, for a pull request or a CI artifact."""
    a, b = result.run_a, result.run_b
    arm_header, arm_cells, speed_header, speed_cells = _cells(result)

    def table(header, cells):
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return lines + ["| " + " | ".join(map(str, row)) + " |" for row in cells]

    lines = [f"# e2eprof diff: {b.path.name} (B) vs {a.path.name} (A)", "",
             f"- A: `{a.path}` (run {a.run.get('run_id')})", f"- B: `{b.path}` (run {b.run.get('run_id')})", "",
             _method_line(result), "", "## What changed", ""]
    lines += [f"- {c}" for c in result.changes] or ["- nothing recorded differs"]
    lines += ["", "## Flags", ""] + ([f"- {f}" for f in result.flags] or ["- none"])
    lines += ["", "## Per point, workload and arm" if result.sweep else "## Per workload and arm", ""]
    lines += table(arm_header, arm_cells)
    lines += ["", "## Kernel speedup (patched vs baseline)", ""]
    lines += table(speed_header, speed_cells) if speed_cells else ["no workload with both arms in both runs"]
    lines += ["", f"**{outcome(result)}**", ""]
    return "\n".join(lines)


def print_diff(console: Console, result: RunDiff) -> None:
    """The terminal view: changes, flags, the two tables, the outcome line and where the files are."""
    arm_header, arm_cells, speed_header, speed_cells = _cells(result)
    console.print(f"e2eprof diff: B = {result.run_b.path} vs A = {result.run_a.path}")
    console.print("what changed:" + ("" if result.changes else " nothing recorded differs"))
    for change in result.changes:
        console.print(f"  - {change}", markup=False, highlight=False)
    for flag in result.flags:
        console.print(f"  [yellow]flag[/yellow] {escape(flag)}")
    style = {SLOWER: "bold red", SPEEDUP_DROPPED: "bold red", OUT_OF_MEMORY_IN_B: "bold red", FASTER: "green",
             SPEEDUP_GREW: "green"}
    arm_title = "per point, workload and arm" if result.sweep else "per workload and arm"
    for title, header, cells in ((arm_title, arm_header, arm_cells),
                                 ("kernel speedup (patched vs baseline)", speed_header, speed_cells)):
        if not cells:
            continue
        table = Table(title=title, title_justify="left")
        for column in header:
            table.add_column(column, justify="left" if column in ("point", "workload", "arm", "status") else "right")
        for row in cells:
            table.add_row(*row[:-1], f"[{style[row[-1]]}]{row[-1]}[/]" if row[-1] in style else row[-1])
        console.print(table)
    console.print(_method_line(result), style="dim")
    console.print(outcome(result), style="bold red" if result.exit_code else "bold green")
    if result.out_dir is not None:
        console.print(f"diff: {result.out_dir}")
