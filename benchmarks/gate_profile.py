"""Where the correctness gate's seconds go: one patched arm's verified captures, timed and profiled with cProfile.

For each workload: the cold step, then the gate's capture (every call checked, with the unseen-shape and stress
checks), the trained-like capture, and a revalidation-like capture (per-call checks only), each timed; the gate's
capture also under cProfile, whose top functions (by own time and by cumulative time) go to OUT/gate_profile.txt.
Seconds per part go to OUT/gate_profile.parquet.

Usage: PYTHONPATH=$PWD python3 benchmarks/gate_profile.py OUT [--model gpt2 --patch fastsoftmax --workload decode
       --device cuda --dtype bf16 --batch 8 --seq 1024 --new-tokens 16]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

from e2eprof.harness.protocol import ArmSpec, WorkerSetup
from e2eprof.harness.worker import ArmWorker


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--model", default="gpt2")
    p.add_argument("--patch", default="fastsoftmax")
    p.add_argument("--workload", action="append")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bf16" if torch.cuda.is_available() else "fp32")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--new-tokens", type=int, default=16)
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    scratch = tempfile.mkdtemp()
    arm = ArmWorker(WorkerSetup(arm=ArmSpec("patched", "eager", True), model=a.model, patch_spec=a.patch,
                                device=a.device, precision=a.dtype, seed=0, batch=a.batch, seq=a.seq,
                                new_tokens=a.new_tokens, scratch_dir=scratch))
    arm.build()
    rows, report = [], io.StringIO()
    for workload in a.workload or ["train", "infer", "decode"]:
        arm.cold(workload)
        parts = {
            "gate capture": lambda: arm.capture(workload, f"{scratch}/gate.safetensors", verify=True),
            "trained-like capture": lambda: arm.trained_like(workload),
            "revalidation capture": lambda: arm.capture(workload, f"{scratch}/again.safetensors", verify=True,
                                                        extended=False),
            "unverified capture": lambda: arm.capture(workload, f"{scratch}/plain.safetensors", verify=False),
        }
        for name, run in parts.items():
            profiler = cProfile.Profile() if name == "gate capture" else None
            synchronize(a.device)
            started = time.perf_counter()
            if profiler:
                profiler.enable()
            result = run()
            synchronize(a.device)
            seconds = time.perf_counter() - started
            if profiler:
                profiler.disable()
                for order in ("tottime", "cumulative"):
                    print(f"\n==== {workload}: {name}, by {order} ====", file=report)
                    pstats.Stats(profiler, stream=report).sort_stats(order).print_stats(25)
            checks = result.get("op_checks", [])
            rows.append({"workload": workload, "part": name, "seconds": seconds,
                         "calls": sum(c["calls"] for c in checks), "signatures": len(checks),
                         "stress_points": sum(c.get("stress_points", 0) for c in checks),
                         "stress_s": sum(c.get("stress_s", 0.0) for c in checks)})
            print(f"{workload:8s} {name:22s} {seconds:8.2f} s  calls {rows[-1]['calls']:5d}  "
                  f"stress points {rows[-1]['stress_points']:4d} in {rows[-1]['stress_s']:.2f} s", flush=True)
            # Written after every part: a run cut short by its time limit keeps what it measured.
            pd.DataFrame(rows).assign(model=a.model, patch=a.patch, device=a.device, dtype=a.dtype, batch=a.batch,
                                      seq=a.seq, torch=torch.__version__).to_parquet(a.out / "gate_profile.parquet",
                                                                                     index=False)
            (a.out / "gate_profile.txt").write_text(report.getvalue())
        arm.end_workload(workload)
    arm.revert()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
