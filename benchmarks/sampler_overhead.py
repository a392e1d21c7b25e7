"""Measure what the NVML sampler costs a training step: gpt2 train steps with the sampler on and off.

Worst case on purpose: the sampler thread runs in the same process as the steps (in `compare` it runs in the
parent process, away from the workers). Blocks alternate on/off so drift cancels. Prints one line per figure.
Usage (GPU machine, from the checkout): PYTHONPATH=$PWD python3 benchmarks/sampler_overhead.py
"""

from __future__ import annotations

import statistics
import time

import torch

from e2eprof.analysis import stats
from e2eprof.trackers.telemetry import open_sampler
from e2eprof.workloads.batches import synthetic_token_batches
from e2eprof.workloads.loops import make_workload
from e2eprof.workloads.models import build_model, resolve_model

BLOCKS, STEPS = 16, 5


def main() -> None:
    device = torch.device("cuda")
    model = build_model(resolve_model("gpt2"), attn_implementation="eager", seed=0)
    workload = make_workload("train", model, device, "bf16")
    batches = synthetic_token_batches(4, 8, 1024, 50257, seed=1, pin=True)

    def step(i: int) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        workload.step(batches[i % len(batches)])
        torch.cuda.synchronize()
        return (time.perf_counter_ns() - t0) / 1e6

    for i in range(15):
        step(i)
    on, off, on_blocks, off_blocks = [], [], [], []
    for block in range(BLOCKS):
        for sampling in ((True, False) if block % 2 == 0 else (False, True)):
            sampler = open_sampler("cuda") if sampling else None
            if sampler:
                sampler.start()
            times = [step(i) for i in range(STEPS)]
            if sampler:
                sampler.stop()
            (on if sampling else off).extend(times)
            (on_blocks if sampling else off_blocks).extend([block] * STEPS)
    ci = stats.ratio_of_medians_ci(off, on, baseline_blocks=off_blocks, candidate_blocks=on_blocks)
    overhead = 1 / ci.ratio - 1
    print(f"sampler off: median {statistics.median(off):.3f} ms over {len(off)} steps")
    print(f"sampler on (20 ms interval, same process): median {statistics.median(on):.3f} ms over {len(on)} steps")
    print(f"overhead: {overhead * 100:+.3f}% of step time (ratio off/on {ci.ratio:.4f}, 95% CI [{ci.low:.4f}, {ci.high:.4f}])")


if __name__ == "__main__":
    main()
