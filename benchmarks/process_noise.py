"""Where the A/A false alarms come from: is a process's step time tied to its memory layout?

Issue 8's first A/A runs on the H200 called two identical gpt2-train processes different (0.992x, 7 of 8 blocks on
the same side), although each process's own interval was tight. Step times there are two-moded (~92.7 ms and
~93.9 ms) and each process keeps its own mix of the two for its whole life, so the offset belongs to the process,
not to a moment: the block bootstrap, which only sees one process per arm, cannot know about it.

One suspect is the memory layout (which physical pages the weights, optimizer state and the allocator's segments
landed on). This script tests it in one fresh process per repetition, with e2eprof's own model, batches and train
step:
  phase "kept":     ROUNDS rounds of STEPS timed steps, nothing changed in between;
  phase "relayout": ROUNDS rounds, each after re-allocating every parameter, gradient and optimizer state behind a
                    random-sized pad, with the allocator's cache emptied (a new layout per round), 2 steps discarded.
If layout is the cause, rounds in "kept" agree with each other while processes differ, and rounds in "relayout"
differ from each other about as much as processes do, which makes the offset visible to a block bootstrap.

Usage: PYTHONPATH=$PWD python3 benchmarks/process_noise.py --processes 6 --out DIR   (writes DIR/process_noise.parquet)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def relayout(model, optimizer, generator) -> int:
    """Give every parameter and optimizer state new memory behind a random pad; return the pad's size in bytes."""
    import torch

    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    pad_bytes = int(torch.randint(0, 512, (1,), generator=generator)) * 2**20 + 256 * int(
        torch.randint(0, 4096, (1,), generator=generator))
    pad = torch.empty(pad_bytes, dtype=torch.uint8, device=device)
    for p in model.parameters():
        p.data = p.data.clone()
        p.grad = None
    for state in optimizer.state.values():
        for key, value in list(state.items()):
            if torch.is_tensor(value) and value.device == device:
                state[key] = value.clone()
    if cuda:
        torch.cuda.empty_cache()  # the old copies' segments go back to the driver; activations get new ones
    model._e2eprof_pad = pad  # kept for the round: the next allocations land behind it
    return pad_bytes


def one_process(args) -> None:
    import torch

    from e2eprof.workloads.batches import synthetic_token_batches
    from e2eprof.workloads.loops import make_workload
    from e2eprof.workloads.models import build_model, describe, resolve_model

    device = torch.device(args.device)
    model = build_model(resolve_model(args.model), attn_implementation="eager", seed=0).to(device)
    workload = make_workload("train", model, device, "bf16")
    batches = synthetic_token_batches(4, args.batch, args.seq, describe(model)["vocab_size"], seed=1, pin=device.type == "cuda")
    generator = torch.Generator().manual_seed(args.repetition)
    counter = 0

    def step() -> float:
        nonlocal counter
        if device.type != "cuda":  # CPU dry run: host time
            began = time.perf_counter()
            workload.step(batches[counter % len(batches)])
            counter += 1
            return (time.perf_counter() - began) * 1e3
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        workload.step(batches[counter % len(batches)])
        end.record()
        torch.cuda.synchronize(device)
        counter += 1
        return start.elapsed_time(end)

    for _ in range(args.warmup):
        step()
    for phase in ("kept", "relayout"):
        for round_index in range(args.rounds):
            pad = 0
            if phase == "relayout":
                pad = relayout(model, workload.optimizer, generator)
                step(), step()
            else:
                time.sleep(0.05)  # the same idle gap a relayout round has, without changing anything
            for position in range(args.steps):
                print(json.dumps({"process": args.repetition, "pid": os.getpid(), "phase": phase, "round": round_index,
                                  "position": position, "pad_bytes": pad, "device_ms": step()}), flush=True)
    if args.profile_steps and device.type == "cuda":  # after the measurements, so a profiler failure costs none
        profile_kernels(step, args.profile_steps, args.repetition)


def profile_kernels(step, n_steps: int, repetition: int) -> None:
    """Which kernels make a slow step slow: each step's kernels in launch order, compared position by position.

    A train step launches the same kernels in the same order every time, so the k-th kernel of every step is the
    same kernel; the positions whose duration spreads most across steps are where the two modes come from.
    Prints one JSON line per step total and one per top-spread position.
    """
    import statistics

    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        totals = [step() for _ in range(n_steps)]
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    per_step = len(kernels) // n_steps
    if per_step == 0 or len(kernels) % n_steps:
        print(json.dumps({"profile": "kernel count not a multiple of the steps", "kernels": len(kernels)}), flush=True)
        return
    durations = [[kernels[s * per_step + k].time_range.elapsed_us() for s in range(n_steps)] for k in range(per_step)]
    spread = sorted(range(per_step), key=lambda k: -statistics.pstdev(durations[k]))
    for s, total in enumerate(totals):
        print(json.dumps({"profile_step": s, "process": repetition, "device_ms": total,
                          "kernel_ms": sum(durations[k][s] for k in range(per_step)) / 1e3}), flush=True)
    for k in spread[:12]:
        print(json.dumps({"profile_position": k, "kernel": kernels[k].name[:120], "min_us": min(durations[k]),
                          "max_us": max(durations[k]), "sd_us": statistics.pstdev(durations[k])}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--processes", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--profile-steps", type=int, default=0, help="kernel-by-kernel spread in the last process")
    parser.add_argument("--out", type=Path, default=Path("process-noise"))
    parser.add_argument("--repetition", type=int, default=-1, help="internal: run one process's measurements")
    args = parser.parse_args()
    if args.repetition >= 0:
        one_process(args)
        return

    import pandas as pd

    rows = []
    for repetition in range(args.processes):
        started = time.perf_counter()
        argv = [sys.executable, __file__, "--repetition", str(repetition), "--model", args.model, "--device", args.device, "--batch",
                str(args.batch), "--seq", str(args.seq), "--rounds", str(args.rounds), "--steps", str(args.steps),
                "--warmup", str(args.warmup)]
        if repetition == args.processes - 1 and args.profile_steps:
            argv += ["--profile-steps", str(args.profile_steps)]
        done = subprocess.run(argv, capture_output=True, text=True)
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        rows += [line for line in lines if "phase" in line]
        for line in lines:
            if "phase" not in line:
                print(json.dumps(line), flush=True)
        print(f"process {repetition}: exit {done.returncode}, {len(lines)} steps, {time.perf_counter() - started:.1f} s"
              + (f"\n{done.stderr[-2000:]}" if done.returncode else ""), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    steps = pd.DataFrame(rows)
    if steps.empty:
        sys.exit("process_noise: no process measured anything")
    steps.to_parquet(args.out / "process_noise.parquet", index=False)
    summarize(steps)


def summarize(steps) -> None:
    """Per phase: spread of round medians within a process, and of process medians; relative to the grand median."""
    grand = steps.device_ms.median()
    rounds = steps.groupby(["phase", "process", "round"]).device_ms.median().rename("round_ms").reset_index()
    for phase, part in rounds.groupby("phase"):
        within = part.groupby("process").round_ms.std().mean() / grand * 100
        per_process = part.groupby("process").round_ms.median()
        print(f"{phase:9s} within-process sd of round medians {within:.2f}%; between-process sd of process medians "
              f"{per_process.std() / grand * 100:.2f}%; process medians (ms) {', '.join(f'{v:.2f}' for v in per_process)}")


if __name__ == "__main__":
    main()
