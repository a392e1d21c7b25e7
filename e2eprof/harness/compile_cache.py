"""One compile-cache folder for every worker of a run and for later runs: Inductor's FX graph cache, AOTAutograd's
cache and Triton's kernels. The second replica of the compile arm, and a repeat run, load compiled artifacts
instead of compiling again. Inductor keys each artifact on the graph and its config, so a patched and a stock arm
never share a wrong one.

E2EPROF_COMPILE_CACHE picks the folder; "off" leaves torch's own defaults. The compile arm's cold steps stay a
measured figure: jit.parquet counts cache hits and misses per phase, and run.parquet says whether the folder was
warm as the run began, so a cold figure from a warm cache is never read as a compilation from scratch.
"""

from __future__ import annotations

import os
from pathlib import Path

VARIABLE = "E2EPROF_COMPILE_CACHE"


def folder() -> Path | None:
    """The run's compile-cache folder, None when turned off."""
    chosen = os.environ.get(VARIABLE, "").strip()
    if chosen.lower() in ("off", "none", "0"):
        return None
    if chosen:
        return Path(chosen).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "e2eprof" / "compile"


def environment() -> dict[str, str]:
    """Variables a worker needs before it loads torch; a user's own setting of any of them wins."""
    where = folder()
    if where is None:
        return {}
    wanted = {"TORCHINDUCTOR_CACHE_DIR": str(where / "inductor"), "TRITON_CACHE_DIR": str(where / "triton"),
              "TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}
    return {k: v for k, v in wanted.items() if k not in os.environ}


def describe() -> dict:
    """For run.parquet, as the run starts: the folder and whether it already held artifacts (a warm cache)."""
    where = folder()
    if where is None:
        return {"compile_cache_dir": None, "compile_cache_warm": None}
    where.mkdir(parents=True, exist_ok=True)
    return {"compile_cache_dir": str(where), "compile_cache_warm": any(p.is_file() for p in where.rglob("*"))}
