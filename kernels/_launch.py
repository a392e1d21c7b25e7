"""Launching a Triton kernel without Triton's per-call Python, once it has been compiled for the arguments' kind.

`kernel[grid](*args)` binds the arguments, builds a specialization key, looks the compiled kernel up, checks the
kernel's globals and asks for launch metadata on every call: tens of microseconds of host time, more than a small
softmax's whole device time (benchmarks/host_overhead.py splits it). `launch` does that once per kind of call and
then calls the compiled kernel's own launcher directly, on the current stream (so CUDA-graph capture and side
streams behave exactly as with `kernel[grid]`).

Correctness rests on one rule: two calls share a compiled kernel only if Triton itself would have given them the
same one. The key holds the kernel, its constexprs and launch options, the device, and for every runtime argument
Triton's own specialization of it (`native_specialize_impl`, the function Triton's binder calls: a tensor's dtype
and 16-byte alignment, an integer's width, divisibility by 16 and equality to 1). The first call of each kind
goes through `kernel[grid]`, which compiles and launches it, and its compiled kernel is kept for the key.

Every case this does not cover takes the ordinary `kernel[grid]` path, which is always correct: CPU tensors (the
interpreter), a Triton without `native_specialize_impl`, a launch hook (Triton's profilers) or pre-run hook set, a
tensor on another device than the current one, a call leaving parameters to their defaults, and
E2EPROF_TRITON_FAST_LAUNCH=0.
"""

from __future__ import annotations

import contextlib
import os

import torch

try:
    import triton as _triton
    from triton import knobs as _knobs
    from triton._C.libtriton import native_specialize_impl as _specialize
    from triton.backends.compiler import BaseBackend as _Backend
except ImportError:  # an older or newer Triton: every launch takes the ordinary path
    _triton = _knobs = _specialize = _Backend = None

ENV = "E2EPROF_TRITON_FAST_LAUNCH"
_ENABLED = _specialize is not None and os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")

# The Triton whose CUDA launcher's C entry point `launch` calls itself: its argument list is private and changes
# between releases (3.8's is another), so only the release whose driver.py it was read from and whose GPU tests
# passed (tests/gpu/test_launch_cuda.py) takes that last shortcut; any other goes through `compiled.run`.
_C_LAUNCH_TRITON = "3.6."
_C_LAUNCH = _ENABLED and getattr(_triton, "__version__", "").startswith(_C_LAUNCH_TRITON)

# (kernel, device, constexprs and options, per-argument specializations) ->
#   (compiled kernel, constexpr values, the launcher's C entry point and its leading arguments, or None)
_COMPILED: dict[tuple, tuple] = {}
# Launches through a compiled kernel's own launcher, and through kernel[grid] (tests and benchmarks read these).
STATS = {"direct": 0, "ordinary": 0}
_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")  # launch options, not kernel parameters


def launch(kernel, grid: tuple[int, ...], *args, **constexprs) -> None:
    """`kernel[grid](*args, **constexprs)` on the device of the first argument (a tensor), the fast way when it can.

    `args` are the kernel's runtime parameters, positionally and in its order; `constexprs` its constexpr
    parameters in its order, then Triton's launch options (num_warps, num_stages), by name.
    """
    first = args[0]
    if _ENABLED and first.is_cuda:
        device = first.get_device()
        if device == torch._C._cuda_getDevice():
            # id(kernel): a JITFunction hashes through a locked property; the kernels live as long as their module.
            key = (id(kernel), device, *constexprs.items(),
                   *[_specialize(_Backend, a, False, True, True) for a in args])
            entry = _COMPILED.get(key)
            if entry is not None and _unhooked(_knobs.runtime.launch_enter_hook) \
                    and _unhooked(_knobs.runtime.launch_exit_hook):
                compiled, constants, c_launch = entry
                stream = torch._C._cuda_getCurrentRawStream(device)
                gx, gy, gz = grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1
                if c_launch is not None:  # no launch hook, no scratch: what compiled.run would pass, minus its Python
                    c_launch[0](gx, gy, gz, stream, *c_launch[1], *args, *constants)
                else:  # no hook: no launch metadata, none to call
                    compiled.run(gx, gy, gz, stream, compiled.function, compiled.packed_metadata, None, None, None,
                                 *args, *constants)
                STATS["direct"] += 1
                return
            compiled = kernel[grid](*args, **constexprs)
            STATS["ordinary"] += 1
            if _cacheable(kernel, compiled, len(args), constexprs):
                # The compiled launcher takes every parameter, constexprs too (it skips them), in the kernel's order.
                _COMPILED[key] = (compiled, tuple(v for k, v in constexprs.items() if k not in _OPTIONS),
                                  _c_launcher(compiled))
            return
    with _device_of(first):
        kernel[grid](*args, **constexprs)
    STATS["ordinary"] += 1


def next_power_of_2(n: int) -> int:
    """`triton.next_power_of_2(n)` for a host int (0 for 0, as Triton gives). Triton's own is a constexpr function
    (Triton >= 3.5): every host call runs an import statement and unwraps its arguments, about 2.3 us against 0.03 us
    for this (dev CPU, Triton 3.8), and every launch of a row kernel pays one."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def cdiv(a: int, b: int) -> int:
    """`triton.cdiv(a, b)` for host ints (same cost story as next_power_of_2)."""
    return -(-a // b)


def _c_launcher(compiled) -> tuple | None:
    """(the C launch function, its arguments before the kernel's) for a kernel Triton 3.6 compiled, or None.

    Triton 3.6's `CudaLauncher.__call__` allocates the global and profile scratch (when the kernel needs any) and
    calls its C `launch(gridX, gridY, gridZ, stream, function, cooperative, pdl, global_scratch, profile_scratch,
    kernel_metadata, launch_metadata, enter_hook, exit_hook, *args)`. For a kernel with no scratch, calling that C
    function directly passes the same values without the Python frame (about 0.4 us on the dev CPU)."""
    if not _C_LAUNCH:
        return None
    run = compiled.run
    if type(run).__name__ != "CudaLauncher" or not callable(getattr(run, "launch", None)) \
            or getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return None
    return run.launch, (compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                        compiled.packed_metadata, None, None, None)


def _unhooked(hook) -> bool:
    # Triton >= 3.5 keeps every launch hook as a HookChain, empty unless a profiler added to it; older ones None.
    return hook is None or not getattr(hook, "calls", True)


def _cacheable(kernel, compiled, positional: int, constexprs: dict) -> bool:
    """Whether later calls of this kind may skip `kernel[grid]`: the call named every parameter in order, no
    pre-run hook is set, and Triton returned a compiled kernel with the launcher `launch` calls."""
    return (names_every_parameter(kernel, positional, constexprs) and not getattr(kernel, "pre_run_hooks", None)
            and all(hasattr(compiled, attr) for attr in ("run", "function", "packed_metadata")))


def names_every_parameter(kernel, positional: int, constexprs: dict) -> bool:
    """Whether a call passes every parameter of `kernel`: `positional` runtime ones first, then the constexprs by
    name in the kernel's order (launch options aside). A call that leaves one to its default, or names the
    constexprs in another order, would hand the compiled launcher misplaced values, so it is never cached."""
    names = [k for k in constexprs if k not in _OPTIONS]
    params = list(getattr(kernel, "arg_names", ()))
    return params[positional:] == names and len(params) == positional + len(names)


def _device_of(t: torch.Tensor):
    # Triton launches on the current CUDA device; make it the tensor's so cuda:1 inputs work. CPU tensors (the
    # interpreter) need no guard.
    if t.is_cuda:
        return torch.cuda.device(t.device)
    return contextlib.nullcontext()
