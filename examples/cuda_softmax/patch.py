"""A CUDA C++ kernel (softmax.cu) wrapped into an e2eprof patch with torch.utils.cpp_extension.load_inline.

    e2eprof compare --model gpt2 --patch examples/cuda_softmax/patch.py

The recipe, for any `.cu` file that exposes `torch::Tensor fn(torch::Tensor ...)`:
  1. Read the source and hand it to load_inline with a one-line C++ declaration of `fn` and functions=["fn"]
     (load_inline writes the Python binding). Do it lazily, on the first call: every arm process imports this
     file, and only the patched arm should pay for (or need) a compiler.
  2. Build into a directory named after a hash of the sources, so an edited kernel is rebuilt and an unchanged
     one is loaded from the cache in every later process (E2EPROF_BUILD_DIR moves the cache).
  3. Wrap the call in a torch.autograd.Function (training needs a backward) and in a function with exactly the
     replaced function's signature and output dtype; count the calls per implementation.
  4. Give CPU tensors a real implementation too (here C++, also through load_inline), never a silent fallback
     to the stock op: e2eprof's counters would show the kernel did not run.
"""

import functools
import hashlib
import math
import os
from collections import Counter
from pathlib import Path

import torch

from e2eprof.patch import Patch

HERE = Path(__file__).resolve().parent
BUILD_DIR_ENV = "E2EPROF_BUILD_DIR"
CALLS: Counter = Counter()  # "cuda.fwd" / "cpu.fwd": which implementation each call ran


def _build(name: str, **sources: str):
    """Compile (or load from the cache) one extension with load_inline; raise one clear RuntimeError on failure."""
    # Imported on first use: torch.utils.cpp_extension is slow to import and only the patched arm needs it.
    from torch.utils.cpp_extension import load_inline

    digest = hashlib.sha256(repr(sorted(sources.items())).encode() + torch.__version__.encode()).hexdigest()[:12]
    root = Path(os.environ.get(BUILD_DIR_ENV) or Path.home() / ".cache" / "e2eprof" / "build")
    build_dir = root / f"{name}_{digest}"
    build_dir.mkdir(parents=True, exist_ok=True)
    try:
        return load_inline(name=f"{name}_{digest}", build_directory=str(build_dir), **sources)
    except Exception as exc:  # compiler output is long: keep its first line, point at the build log
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RuntimeError(f"building {name} failed ({first}); sources and log in {build_dir}") from exc


@functools.cache
def cuda_extension():
    """softmax.cu compiled for this machine's GPU, with the C++ declaration load_inline binds to Python."""
    from torch.utils.cpp_extension import CUDA_HOME

    if torch.version.cuda is None:
        raise RuntimeError("cuda_softmax: this torch build has no CUDA support, so softmax.cu cannot be built; "
                           "install a CUDA build of torch or run on CPU tensors")
    if CUDA_HOME is None:
        raise RuntimeError(f"cuda_softmax: nvcc not found; install the CUDA {torch.version.cuda} toolkit and set "
                           "CUDA_HOME to it (softmax.cu is compiled on first use)")
    return _build("e2eprof_example_softmax_cuda",
                  cpp_sources="torch::Tensor softmax_cuda(torch::Tensor x);",
                  cuda_sources=(HERE / "softmax.cu").read_text(), functions=["softmax_cuda"],
                  extra_cuda_cflags=["-O3"])


@functools.cache
def cpu_extension():
    """softmax_cpu.cpp compiled with the host C++ compiler (g++/clang++), OpenMP-parallel over rows."""
    return _build("e2eprof_example_softmax_cpu", cpp_sources=(HERE / "softmax_cpu.cpp").read_text(),
                  functions=["softmax_cpu"], extra_cflags=["-O3"])


def softmax_rows(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim of a contiguous fp32 (rows, cols) matrix, by the compiled kernel for x's device."""
    if x.device.type == "cuda":
        CALLS["cuda.fwd"] += 1
        return cuda_extension().softmax_cuda(x)
    if x.device.type == "cpu":
        CALLS["cpu.fwd"] += 1
        return cpu_extension().softmax_cpu(x)
    raise RuntimeError(f"cuda_softmax has no implementation for {x.device}")  # never a silent fallback


class _RowSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2d):  # x2d: (R, C) fp32, contiguous
        y = softmax_rows(x2d)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        # dx = y * (g - sum(g * y)) per row; in PyTorch ops: only the forward is the custom kernel here.
        (y,) = ctx.saved_tensors
        return y * (grad - (grad * y).sum(-1, keepdim=True))


def _legacy_dim(ndim: int) -> int:
    return 0 if ndim in (0, 1, 3) else 1  # what torch.nn.functional.softmax does without dim


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    """Drop-in for torch.nn.functional.softmax: the compiled fp32 kernel, output in the stock op's dtype."""
    dim = _legacy_dim(input.dim()) if dim is None else dim
    out_dtype = dtype or (torch.float32 if torch.is_autocast_enabled(input.device.type) else input.dtype)
    moved = input.movedim(dim, -1) if input.dim() else input.reshape(1)  # (..., C)
    # The kernel is fp32 in and out: other dtypes cost a conversion each way (GPT-2's scores are fp32 already).
    x2d = moved.float().contiguous().reshape(math.prod(moved.shape[:-1]), moved.shape[-1])  # (R, C); C may be 0
    y = _RowSoftmax.apply(x2d).reshape(moved.shape)
    y = y.movedim(-1, dim).contiguous() if input.dim() else y.reshape(())  # stock softmax returns a contiguous tensor
    return y.to(out_dtype)


def reference(input, dim=None, _stacklevel=3, dtype=None):
    """fp64 reference (e2eprof passes float64 inputs)."""
    return torch.softmax(input, _legacy_dim(input.dim()) if dim is None else dim)


PATCH = Patch(
    name="cudasoftmax",
    description="CUDA C++ row softmax (softmax.cu via load_inline; C++ on CPU) in GPT-2 eager attention",
    targets=("transformers.models.gpt2.modeling_gpt2:nn.functional.softmax",),
    replacement=softmax,
    reference=reference,
    architectures=("gpt2",),
    attn_implementation="eager",
    implementations=lambda: dict(CALLS),
    kernel_names=("softmax_rows_kernel",),  # the kernel's name as the profiler shows it on CUDA
)
