"""Which implementation a built-in kernel runs: Triton on CUDA, the real CPU implementation on the CPU.

Shared by every kernel's op.py. There is deliberately no fallback to the stock PyTorch op: a patch that silently
runs the stock op is exactly what e2eprof must catch, so a missing implementation raises instead. On the CPU an
environment variable per kernel (e.g. E2EPROF_FASTSOFTMAX_IMPL=triton) forces the Triton kernels, which is only
meaningful under TRITON_INTERPRET=1 (the tests use it to run the Triton code without a GPU).

Also the helpers every op.py would otherwise repeat: the lazy import of its Triton module (triton_kernels), the
floating-dtype check of its arguments (check_float), the registration of an op's kernels (register_kernels) and
the test of whether an eager call may skip the dispatcher (run_directly).
"""

from __future__ import annotations

import functools
import importlib
import os
import types

import torch

try:
    import triton  # noqa: F401  (only probed here; each kernel imports its Triton module on first use)

    TRITON_AVAILABLE = True
except ImportError:
    TRITON_AVAILABLE = False


def interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on")


def choose_impl(t: torch.Tensor, *, op: str, env_var: str, stock: str, triton_available: bool) -> str:
    """"triton" or "cpu" for tensor `t`, or raise.

    op: the kernel's name for messages ("fastsoftmax"); stock: what it replaces ("torch.softmax"); triton_available:
    passed by the caller (read from its own module at call time, so tests can switch it off per kernel).
    """
    if t.is_cuda:  # not t.device.type: building a torch.device per call costs host time on every op call
        if not triton_available:
            raise RuntimeError(
                f"e2eprof::{op} got a CUDA tensor but triton is not installed; refusing to fall back to {stock} "
                f"(install triton, or do not apply the {op} patch)"
            )
        return "triton"
    if t.device.type != "cpu":
        raise RuntimeError(f"e2eprof::{op} has no implementation for device {t.device}")
    choice = os.environ.get(env_var, "").strip().lower()
    if choice in ("", "auto", "cpu"):
        return "cpu"
    if choice == "triton":
        if not triton_available:
            raise RuntimeError(f"{env_var}=triton but triton is not installed")
        if not interpreter_on():
            raise RuntimeError(f"{env_var}=triton on a CPU tensor needs TRITON_INTERPRET=1, set before triton is first imported")
        return "triton"
    raise ValueError(f"{env_var} must be 'cpu', 'triton' or 'auto', got {choice!r}")


@functools.cache
def triton_kernels(package: str) -> types.ModuleType:
    """The Triton module (`<package>.triton_kernels`) of the kernel package `package`, imported on first use.

    Imported lazily: the module imports triton at top level, and @triton.jit decides at decoration time whether
    to build interpreted kernels, so TRITON_INTERPRET must already be set when this first runs. Then kept: an
    import call on every kernel call costs host time.
    """
    return importlib.import_module(f"{package}.triton_kernels")


def check_float(op: str, name: str, dtype: torch.dtype) -> None:
    """Raise TypeError naming e2eprof::<op> and the argument when `dtype` is not a floating dtype."""
    if not dtype.is_floating_point:
        raise TypeError(f"e2eprof::{op}: {name} must be a floating dtype, got {dtype}")


def register_kernels(lib: torch.library.Library, name: str, *, impl, autograd, fake) -> None:
    """The three kernels of one op defined in `lib`: its implementation for every backend (CompositeExplicitAutograd;
    the implementation itself raises for a device it has no code for), its Autograd kernel (given the dispatch key
    set, so it can redispatch below autograd) and its fake kernel (shapes and dtypes, for torch.compile)."""
    lib.impl(name, impl, "CompositeExplicitAutograd")
    lib.impl(name, autograd, "Autograd", with_keyset=True)
    torch.library.register_fake(f"{lib.ns}::{name}", fake, lib=lib)


# nn.Parameter is a plain tensor too (it turns torch functions off for itself); any other subclass, FakeTensor and
# DTensor among them, may want to see the op.
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def run_directly(*tensors: torch.Tensor | None) -> bool:
    """Whether an eager call of a built-in op may run its implementation directly instead of through the dispatcher.

    A Python op pays the dispatcher twice per call (its Autograd kernel, then its implementation), several times the
    host time of the stock op it replaces; the ops' public functions skip it where nothing can tell the difference:
    plain tensors, no torch.compile tracing, no torch-function or dispatch mode (fake tensors, functionalization,
    FLOP counters), no functorch transform, and no profiler, which must see the named op (e2eprof::fastsoftmax and
    its kernels) in its trace. Everywhere else the call goes through `torch.ops.e2eprof.*` as before; both paths run
    the same implementation, so their results are the same bit for bit.
    """
    if (torch.compiler.is_compiling() or torch._C._len_torch_function_stack() or torch._C._len_torch_dispatch_stack()
            or torch._C._functorch.peek_interpreter_stack() is not None or torch._C._autograd._profiler_enabled()):
        return False
    for t in tensors:
        if t is not None and type(t) not in _PLAIN_TENSORS:
            return False
    return True
