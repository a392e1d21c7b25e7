"""Just-in-time work inside a worker process: Triton compilations and autotuning, torch.compile graph compilations,
CUDA graph captures.

Each is a one-off cost that belongs in the cold step or warm-up. One that happens inside timed steps is a silent
error: the step paid a compilation, not the kernel (Triton specialises on integer arguments and recompiles for new
values, torch.compile recompiles on new shapes, a CUDA graph re-records). The worker counts them around every
command, so the report says in which phase each happened (jit.parquet), and one in timed steps is a finding.

What is counted, and how:
- triton_compiles: Triton's post-compile hook (triton.knobs.runtime.jit_post_compile_hook, Triton >= 3.4), once per
  kernel specialisation this process builds or loads from Triton's disk cache. Kernels Inductor generates are
  compiled by Inductor and counted under compile_graphs instead. None where the hook does not exist.
- autotune_runs: Triton autotuners that had to benchmark their configs (a new tuning key).
- compile_graphs: graphs torch.compile (Dynamo) compiled, recompilations included.
- fxgraph_cache_hits / fxgraph_cache_misses: Inductor graphs loaded from / added to the FX graph cache
  (e2eprof.harness.compile_cache): a cold step with hits and no misses loaded its compilation from disk.
- graph_captures: CUDA graph captures (torch.cuda.CUDAGraph.capture_begin): the decode workload's own and those of
  torch.compile's mode="reduce-overhead".
"""

from __future__ import annotations

import threading

COUNTS = ("triton_compiles", "autotune_runs", "compile_graphs", "graph_captures", "fxgraph_cache_hits",
          "fxgraph_cache_misses")

_lock = threading.Lock()
_counts = {"triton_compiles": 0, "autotune_runs": 0, "graph_captures": 0}
_installed = False
_triton_hooked = False


def install() -> None:
    """Hook the counters into this process (once; other hooks already set keep being called)."""
    global _installed, _triton_hooked
    with _lock:
        if _installed:
            return
        _installed = True
    _triton_hooked = _hook_triton()
    _hook_autotuner()
    _hook_graph_capture()


def snapshot() -> dict[str, float]:
    """The counts so far in this process; NaN for what cannot be counted here."""
    totals: dict[str, float] = dict(_counts)
    if not _triton_hooked:
        totals["triton_compiles"] = float("nan")
    totals.update(_dynamo_counts())
    return totals


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before[name] for name in COUNTS}


def _bump(name: str) -> None:
    with _lock:
        _counts[name] += 1


def _hook_triton() -> bool:
    try:
        from triton import knobs
    except ImportError:
        return False
    runtime = getattr(knobs, "runtime", None)
    if runtime is None or not hasattr(runtime, "jit_post_compile_hook"):
        return False
    previous = runtime.jit_post_compile_hook

    def counted(*args, **kwargs):
        _bump("triton_compiles")
        return previous(*args, **kwargs) if previous is not None else None

    runtime.jit_post_compile_hook = counted
    return True


def _hook_autotuner() -> None:
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:
        return
    original = Autotuner.run

    def run(self, *args, **kwargs):
        tuned = len(getattr(self, "cache", {}))
        try:
            return original(self, *args, **kwargs)
        finally:
            if len(getattr(self, "cache", {})) > tuned:
                _bump("autotune_runs")

    Autotuner.run = run


def _hook_graph_capture() -> None:
    import torch

    graph_class = getattr(torch.cuda, "CUDAGraph", None)
    original = getattr(graph_class, "capture_begin", None)
    if original is None:
        return

    def capture_begin(self, *args, **kwargs):
        _bump("graph_captures")
        return original(self, *args, **kwargs)

    graph_class.capture_begin = capture_begin


def _dynamo_counts() -> dict[str, float]:
    import sys

    if "torch._dynamo" not in sys.modules:  # nothing was ever compiled in this process
        return {"compile_graphs": 0.0, "fxgraph_cache_hits": 0.0, "fxgraph_cache_misses": 0.0}
    from torch._dynamo.utils import counters

    return {"compile_graphs": float(counters["stats"]["unique_graphs"]),
            "fxgraph_cache_hits": float(counters["inductor"]["fxgraph_cache_hit"]),
            "fxgraph_cache_misses": float(counters["inductor"]["fxgraph_cache_miss"])}
