"""When `e2eprof compare` starts its worker processes, and how long a started worker's imports take.

On GPU hosts these two decide when a run's first step can begin: a worker imports torch, transformers and the
model's modeling code (harness/prestart.py) while the parent checks, and the parent's checks are shorter. This
measures, in fresh processes, (1) how far into the command the workers are started, and which heavy libraries the
parent had imported by then, and (2) a prestarted worker's imports, step by step. No run is made: the command stops
at the moment it would start its workers. It claims 16 cores for the decision (the 2-core dev CPU has too few for a
head start), so the figure is the one a GPU host's command would show up to that moment.

Usage (repository root): python3 benchmarks/spawn_time.py [--runs 5] [--device cpu] [--model gpt2]
Prints one JSON line per measurement, then the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

_COMMAND = """
import json, os, sys, time
from e2eprof import startup
from e2eprof.harness import isolation, prestart
isolation.available_cores = lambda: tuple(range(16))
def stop_at_spawn(count, parts, model_type):
    age = (time.time_ns() - startup.process_start_unix_ns()) / 1e9
    heavy = sorted(m for m in ("torch", "pandas", "transformers") if m in sys.modules)
    print(json.dumps({"measure": "workers started", "seconds_into_command": round(age, 3), "processes": count,
                      "parent_had_imported": heavy}), flush=True)
    os._exit(0)
prestart.Prestarted = stop_at_spawn
from e2eprof.cli import main
main(sys.argv[1:])
print(json.dumps({"measure": "workers started", "seconds_into_command": None}), flush=True)
"""

_WORKER_IMPORTS = """
import importlib, json, sys, time
started = time.perf_counter()
steps = {}
from e2eprof.harness.prestart import early_imports  # torch-free: its own import is part of a worker's too
for module in ["torch"] + early_imports(sys.argv[1]):
    before = time.perf_counter()
    importlib.import_module(module)
    steps[module] = round(time.perf_counter() - before, 3)
print(json.dumps({"measure": "worker imports", "seconds": round(time.perf_counter() - started, 3), "steps": steps}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="compare's --device (auto: NVML, else torch, decides)")
    parser.add_argument("--model", default="gpt2")
    args = parser.parse_args()
    from e2eprof.workloads.models import declared_architecture

    model_type = declared_architecture(args.model) or "gpt2"
    spawned, imports = [], []
    for _ in range(args.runs):
        out = subprocess.run([sys.executable, "-c", _COMMAND, "compare", "--model", args.model, "--patch", "fastsoftmax",
                              "--device", args.device, "--out", "/nonexistent/e2eprof-spawn-time"],
                             capture_output=True, text=True, timeout=300)
        line = json.loads(out.stdout.strip().splitlines()[-1])
        print(json.dumps(line), flush=True)
        spawned.append(line["seconds_into_command"])
        out = subprocess.run([sys.executable, "-c", _WORKER_IMPORTS, model_type],
                             capture_output=True, text=True, timeout=300, check=True)
        line = json.loads(out.stdout.strip().splitlines()[-1])
        print(json.dumps(line), flush=True)
        imports.append(line["seconds"])
    started = [s for s in spawned if s is not None]
    print(json.dumps({"median_seconds_into_command": statistics.median(started) if started else None,
                      "median_worker_imports_s": statistics.median(imports), "runs": args.runs}))


if __name__ == "__main__":
    main()
