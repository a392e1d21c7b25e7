"""What `diff` reads: its options (DiffConfig), each report directory as a RunRecord, and the row statuses.

Every warm and summary row of a RunRecord carries a sweep point (a run from before sweeps gets its config's one
point), so the same lookups serve sweeps and single runs.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from e2eprof.analysis import stats
from e2eprof.config import DeviceDefaults, noise_floor
from e2eprof.errors import UsageError
from e2eprof.tables.rundir import RunDir
from e2eprof.distributed.ranks import slowest_rank_frame
from e2eprof.sweep import OOM_METRIC, SweepPoint


METRICS = {"wall": "host wall time per step", "device": "CUDA-event device time per step"}

# Row statuses (stable strings: CI pipelines may match on them).
SLOWER, FASTER = "SLOWER", "FASTER"
SPEEDUP_DROPPED, SPEEDUP_GREW = "SPEEDUP_DROPPED", "SPEEDUP_GREW"
NO_SIGNIFICANT_DIFFERENCE, BELOW_MARGIN = "NO_SIGNIFICANT_DIFFERENCE", "BELOW_MARGIN"
TOO_FEW_SAMPLES, ONLY_IN_A, ONLY_IN_B = "TOO_FEW_SAMPLES", "ONLY_IN_A", "ONLY_IN_B"
OUT_OF_MEMORY_IN_A, OUT_OF_MEMORY_IN_B = "OUT_OF_MEMORY_IN_A", "OUT_OF_MEMORY_IN_B"
REGRESSIONS = (SLOWER, SPEEDUP_DROPPED, OUT_OF_MEMORY_IN_B)


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

    def noise_floor(self, workload: str) -> float:
        """process_noise, or the workload's own floor where the run recorded a higher one (decode on a GPU)."""
        return noise_floor(self.process_noise, self.config.get("workload_process_noise"), workload)

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


def is_sweep(a: RunRecord, b: RunRecord) -> bool:
    """Rows need a point to be told apart when either run covers more than one."""
    return len(a.points) > 1 or len(b.points) > 1


def common_points(a: RunRecord, b: RunRecord) -> list[str]:
    return [p for p in a.points if p in b.points]


def _key(sweep: bool, point: str, *names: str) -> str:
    """'infer/patched', or 'b8-s1024-bf16/infer/patched' in a sweep."""
    return "/".join(([point] if sweep else []) + list(names))
