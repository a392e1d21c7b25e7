"""Parquet report tables: fixed names, a schema version, atomic writes.

Every table is written to a temporary name in the same directory and renamed into place, so a reader (or a
run killed mid-write) never sees a half-written Parquet file. Tables are rewritten whole as a run goes, which
keeps each file self-consistent at every moment.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pandas as pd

SCHEMA_VERSION = 1

# Required columns per table: tests check them, readers (report/diff) rely on them.
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    "run": ("run_id", "schema_version", "status", "command_line", "config_json", "environment_json", "patch_spec",
            "patch_origin", "patch_source_sha256", "seed", "batch_digest", "started_unix_ns", "ended_unix_ns"),
    "steps": ("run_id", "workload", "arm", "block", "step", "rank", "phase", "wall_ns", "device_ms", "start_unix_ns",
              "end_unix_ns", "ttft_ms", "tpot_ms"),
    "correctness": ("run_id", "workload", "arm", "tensor", "metric", "value", "tolerance", "passed", "detail"),
    # Per-op and per-kernel rows of the profiles (a CPU run launches no kernels: its table has the columns, no rows).
    "ops": ("run_id", "point", "workload", "arm", "rank", "module", "op", "input_shapes", "in_replaced", "direction",
            "count", "self_device_us", "self_cpu_us", "kernels"),
    "kernels": ("run_id", "point", "workload", "arm", "rank", "kernel", "op", "calls", "total_us", "median_us"),
    # Just-in-time work per process and phase (e2eprof.trackers.jit_events): compilations, autotuning, CUDA graph captures.
    "jit": ("run_id", "point", "workload", "arm", "replica", "rank", "phase", "triton_compiles", "autotune_runs",
            "compile_graphs", "graph_captures"),
    "summary": ("run_id", "workload", "arm", "n", "median_ms", "mean_ms", "p10_ms", "p90_ms", "iqr_ms", "cv",
                "cold_ms", "speedup_vs_baseline", "ci_low", "ci_high", "mw_p", "speedup_vs_sdpa", "sdpa_ci_low",
                "sdpa_ci_high", "correct", "verdict", "reasons"),
}


def write_table(out_dir: Path, name: str, rows: list[dict] | pd.DataFrame) -> Path:
    """Write `<out_dir>/<name>.parquet` atomically; columns listed in TABLE_COLUMNS must be present."""
    # A shallow copy: adding the missing required columns must not change the caller's frame.
    frame = rows.copy(deep=False) if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    required = TABLE_COLUMNS.get(name, ())
    for column in required:
        if column not in frame.columns:
            frame[column] = pd.NA
    ordered = list(required) + [c for c in frame.columns if c not in required]
    frame = frame[ordered]
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / f"{name}.parquet"
    # A unique name that pyarrow creates itself, so the file gets the usual umask mode (mkstemp's is 0600 and
    # would survive the rename, leaving reports unreadable to anyone else).
    tmp = out_dir / f".{name}.{os.getpid()}.{uuid.uuid4().hex}.parquet.tmp"
    try:
        frame.to_parquet(tmp, index=False)
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return final


def check_writable(folder: Path) -> None:
    """Raise OSError unless a file can be created in `folder`: permissions alone do not tell (root ignores them,
    read-only mounts and /proc refuse anyway), and finding out after an hour of measuring would lose it all."""
    probe = Path(folder) / f".e2eprof-write-check-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    probe.write_bytes(b"")
    probe.unlink()


def read_table(run_dir: Path, name: str) -> pd.DataFrame:
    """Read one table of a run directory."""
    return pd.read_parquet(Path(run_dir) / f"{name}.parquet")


def to_json(value) -> str:
    """Stable JSON for nested config/environment columns (Parquet keeps them as strings)."""
    return json.dumps(value, sort_keys=True, default=str)
