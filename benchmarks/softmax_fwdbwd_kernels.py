"""Which kernels a forward + backward of GPT-2's attention softmax launches: fastsoftmax, eager, torch.compile.

The microbenchmark measured fastsoftmax's forward + backward 89 us slower than its two kernels add up to.
This lists every device kernel of one fwd+bwd call per implementation, from torch.profiler, so an extra kernel (a
copy, a fill, a dtype conversion) is seen by name, with the device time of each and their sum per call.

Usage (repository root, on a GPU): PYTHONPATH=$PWD python3 benchmarks/softmax_fwdbwd_kernels.py
"""

from __future__ import annotations

import collections

import torch
import torch.nn.functional as F

from e2eprof.kernels.fastsoftmax.patch import softmax_like_torch

SHAPE = (8, 12, 1024, 1024)  # gpt2 at batch 8 x 1024: what the model hands softmax (fp32, its mask promotes bf16)
CALLS = 5


def fwd_bwd(fn, x, grad):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = fn(x, dim=-1)
    torch.autograd.grad([y], [x], [grad])


def kernels_of(name, fn, x, grad) -> None:
    for _ in range(3):  # JIT, autotune, compile
        fwd_bwd(fn, x, grad)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fwd_bwd(fn, x, grad)
        torch.cuda.synchronize()
    per_kernel = collections.defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[event.name][0] += 1
            per_kernel[event.name][1] += event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
    total = sum(us for _, us in per_kernel.values()) / CALLS
    print(f"== {name}: {total:.1f} us of kernels per fwd+bwd call")
    for kernel, (count, us) in sorted(per_kernel.items(), key=lambda kv: -kv[1][1]):
        print(f"   {count / CALLS:4.1f} x {us / count:8.1f} us  {kernel[:110]}")


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(SHAPE, device="cuda", dtype=torch.float32, requires_grad=True)
    grad = torch.randn(SHAPE, device="cuda", dtype=torch.float32)
    kernels_of("fastsoftmax (softmax_like_torch)", softmax_like_torch, x, grad)
    kernels_of("eager F.softmax", F.softmax, x, grad)
    kernels_of("torch.compile(F.softmax)", torch.compile(F.softmax), x, grad)


if __name__ == "__main__":
    main()
