"""Host cost per call of softmax: torch.softmax vs fastsoftmax (the named op) vs the patched GPT-2 softmax.

On a tiny CPU tensor the math is negligible, so what is measured is the host's per-call cost: Python, the
dispatcher, custom_op's machinery and, for the patched arm, e2eprof's call recorder. That cost is what made the
fastsoftmax arm of small-shape gpt2 train steps slower on the H200 (reports/2026-12-02-h200-gpt2-fastsoftmax-sweep).
Each figure is in microseconds per call over REPEATS blocks of CALLS calls; the arms' blocks are interleaved so
drift on a shared machine hits them alike, and both the median and the minimum block are printed (on a busy
machine the minimum is the steadier estimate of the cost itself). One thread, so a busy machine disturbs it less.

Usage (from the checkout): PYTHONPATH=$PWD python3 benchmarks/host_overhead.py

Recorded 2026-12-02 on a CPU-only machine with 2 shared cores (a CI run going on, load average 2.4-4), torch 2.13.0+cpu,
before/after kernels/fastsoftmax/op.py moved from torch.library.custom_op to torch.library.Library (runs
alternated, two each; us per call, minimum block, the steadier figure here; medians in parentheses):

    arm                 fwd before        fwd after       fwd+bwd before        fwd+bwd after
    torch.softmax       3.9-4.3           3.9-4.2         22.5-22.9             22.4-24.1
    fastsoftmax (op)    60-68 (103-110)   43-49 (76-82)   234-291 (336-381)     183-207 (285-289)
    patched F.softmax   70-87 (121)       53 (89-91)      253-284 (349-388)     193-216 (300-321)

About a fifth to a quarter less per call. What is left is mostly cpu.py's own elementwise torch calls (about 16 us
forward and 17 us backward here; on a GPU Triton launches stand in for them), the autograd engine's Python-node
cost for the backward, and, in the patched arm, e2eprof's call recorder.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

import transformers.models.gpt2.modeling_gpt2 as modeling_gpt2
from e2eprof.kernels.fastsoftmax import fastsoftmax
from e2eprof.patching import apply_patch
from e2eprof.registry import load_patch

SHAPE = (1, 2, 4, 4)  # (B, nh, T, T): attention scores small enough that only host cost is left
WARMUP, CALLS, REPEATS = 200, 200, 21


def block_us(step: Callable[[], None]) -> float:
    """Microseconds per call of `step`, over one block of CALLS calls."""
    t0 = time.perf_counter_ns()
    for _ in range(CALLS):
        step()
    return (time.perf_counter_ns() - t0) / CALLS / 1e3


def steps(softmax: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, Callable[[], None]]:
    """One call of `softmax` forward only (no grad), and one forward + backward."""
    x = torch.randn(SHAPE)
    xg = x.clone().requires_grad_()
    grad = torch.ones(SHAPE)

    def forward() -> None:
        with torch.no_grad():
            softmax(x)

    def forward_backward() -> None:
        softmax(xg).backward(grad)

    return {"fwd": forward, "fwd+bwd": forward_backward}


def measure(arms: dict[str, Callable[[torch.Tensor], torch.Tensor]]) -> dict[tuple[str, str], list[float]]:
    """Raw per-call times, one per block, keyed by (arm, "fwd" | "fwd+bwd"); arms interleaved block by block."""
    calls = {(arm, kind): step for arm, softmax in arms.items() for kind, step in steps(softmax).items()}
    for step in calls.values():
        for _ in range(WARMUP):
            step()
    times: dict[tuple[str, str], list[float]] = {key: [] for key in calls}
    for _ in range(REPEATS):
        for key, step in calls.items():
            times[key].append(block_us(step))
    return times


def main() -> None:
    torch.set_num_threads(1)
    arms = {
        "torch.softmax": lambda x: torch.softmax(x, -1),
        "fastsoftmax (op)": lambda x: fastsoftmax(x, -1),
        # Looked up at call time, as GPT-2's attention does: the patch replaces this attribute.
        "patched F.softmax": lambda x: modeling_gpt2.nn.functional.softmax(x, dim=-1),
    }
    applied = apply_patch(load_patch("fastsoftmax").patch)
    try:
        times = measure(arms)
    finally:
        applied.revert()
    print(f"host us per call, tensor {'x'.join(map(str, SHAPE))} float32, {REPEATS} blocks of {CALLS} calls: median (min)")
    print(f"{'':<20}{'fwd':>16}{'fwd+bwd':>16}")
    for arm in arms:
        cells = [f"{statistics.median(times[arm, k]):.1f} ({min(times[arm, k]):.1f})" for k in ("fwd", "fwd+bwd")]
        print(f"{arm:<20}{cells[0]:>16}{cells[1]:>16}")


if __name__ == "__main__":
    main()
