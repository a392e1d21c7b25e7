"""One compile-cache folder for every worker of a run and for later runs: Inductor's FX graph cache, AOTAutograd's
cache and Triton's kernels. The second replica of the compile arm, and a repeat run, load compiled artifacts
instead of compiling again. Inductor keys each artifact on the graph and its config, so a patched and a stock arm
never share a wrong one.

E2EPROF_COMPILE_CACHE picks the folder; "off" leaves torch's own defaults. The compile arm's cold steps stay a
measured figure: jit.parquet counts cache hits and misses per phase, and run.parquet says whether the folder was
warm as the run began, so a cold figure from a warm cache is never read as a compilation from scratch.
"""

from __future__ import annotations

import getpass
import os
import tempfile
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
    return {k: v for k, v in wanted.items() if users_setting(k) is None}


def users_setting(name: str) -> str | None:
    """The environment's value of `name`, unless Inductor put it there itself: the first time anything in a process
    asks for Inductor's cache folder, Inductor writes its default into TORCHINDUCTOR_CACHE_DIR, and importing
    transformers' modeling code asks. Workers started after the parent's checks would otherwise inherit that default as
    if a user had chosen it, and use it instead of the run's folder (a user who names the default itself gets the run's
    folder too)."""
    value = os.environ.get(name)
    if name == "TORCHINDUCTOR_CACHE_DIR" and value is not None and os.path.abspath(value) == _inductor_default():
        return None
    return value


def _inductor_default() -> str:
    """Inductor's own default cache folder (torch._inductor.runtime.cache_dir_utils.default_cache_dir)."""
    user = "".join("_" if c in '\\/:*?"<>|' else c for c in _user())
    return os.path.abspath(os.path.join(tempfile.gettempdir(), "torchinductor_" + user))


def effective_folders() -> dict[str, Path]:
    """The folders the workers' compilers will really use: a user's TORCHINDUCTOR_CACHE_DIR or TRITON_CACHE_DIR wins
    over e2eprof's folder (and with E2EPROF_COMPILE_CACHE=off, torch's and Triton's own defaults apply)."""
    ours = folder()
    inductor = users_setting("TORCHINDUCTOR_CACHE_DIR") or (
        str(ours / "inductor") if ours is not None else _inductor_default())
    triton = users_setting("TRITON_CACHE_DIR") or (
        str(ours / "triton") if ours is not None
        else os.path.join(os.environ.get("TRITON_HOME") or str(Path.home()), ".triton", "cache"))  # Triton's default
    return {"inductor": Path(inductor).expanduser(), "triton": Path(triton).expanduser()}


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no user name (a container without an entry in /etc/passwd): as Inductor names it
        return f"uid_{os.getuid()}"


def describe() -> dict:
    """For run.parquet, as the run starts: the folder and whether the caches the workers will use already held
    artifacts (a warm cache). Warmth is read from the folders in effect, not only e2eprof's: on a machine whose
    environment sets TORCHINDUCTOR_CACHE_DIR, an earlier run's graphs are loaded from there, and a compile arm's first
    step is then no compilation from scratch, whatever e2eprof's own folder holds."""
    where = folder()
    if where is not None:
        where.mkdir(parents=True, exist_ok=True)
    used = effective_folders()
    warm = any(p.is_file() for d in used.values() if d.is_dir() for p in d.rglob("*"))
    overridden = [f"{name}: {path}" for name, path in used.items()
                  if where is None or not str(path).startswith(str(where))]
    if where is None:
        return {"compile_cache_dir": None, "compile_cache_warm": warm}
    shown = str(where) if not overridden else f"{where} (set in the environment, and used instead: {'; '.join(overridden)})"
    return {"compile_cache_dir": shown, "compile_cache_warm": warm}
