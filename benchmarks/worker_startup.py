"""Where a worker's start-up goes (the self-benchmark's cost part): imports, CUDA context, patch load, model build.

A worker repeats these steps in a fresh process for every arm; on the H200 "start workers and build models" took
18-20 s. This times each step in the order ArmWorker.build runs them, in a fresh interpreter like a worker's, and
prints one JSON line per step. No e2eprof run is needed. On a GPU the model is built twice: on the CPU, as workers
did before, and on the GPU, as they do now.

Usage (repository root): PYTHONPATH=$PWD python3 benchmarks/worker_startup.py [--model gpt2] [--patch fastsoftmax]
"""

from __future__ import annotations

import argparse
import json
import time

started = time.perf_counter()
last = started


def mark(step: str) -> None:
    global last
    now = time.perf_counter()
    print(json.dumps({"step": step, "seconds": round(now - last, 3), "since_start": round(now - started, 3)}), flush=True)
    last = now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--patch", default="fastsoftmax")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()

    import torch
    mark("import torch")
    import transformers  # noqa: F401
    mark("import transformers")
    device = torch.device(args.device if torch.cuda.is_available() or args.device == "cpu" else "cpu")
    if device.type == "cuda":
        torch.cuda.init()
        torch.empty(1, device=device)
    mark(f"device context ({device})")
    from e2eprof.registry import load_patch
    from e2eprof.workloads.models import build_model, resolve_model
    mark("import e2eprof worker modules")
    loaded = load_patch(args.patch)
    mark("load patch")
    model = build_model(resolve_model(args.model), attn_implementation="eager", seed=0)
    mark("build model (cpu, seeded init)")
    model = model.to(device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    mark("model to device")
    if device.type == "cuda":  # what a worker does now: the weights drawn on the GPU
        del model
        model = build_model(resolve_model(args.model), attn_implementation="eager", seed=0, device=device)
        torch.cuda.synchronize()
        mark("build model (cuda, seeded init; what a worker does)")
    pristine = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    mark("pristine copy to host")
    from e2eprof.patching import apply_patch
    apply_patch(loaded.patch, model)
    mark("apply patch")
    del pristine


if __name__ == "__main__":
    main()
