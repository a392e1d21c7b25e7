"""Host cost per call of every built-in kernel vs the stock op it replaces, forward and forward + backward.

Tensors are tiny, so the math is negligible and what is measured is the host's per-call cost: Python, the
dispatcher, the custom op's machinery, autograd and the kernel's own launches. On CUDA nothing is synchronised
inside a timed block, so the figure is the CPU time of issuing the calls (launch overhead); the queue is drained
between blocks only. Each figure is microseconds per call over REPEATS blocks of CALLS calls; the arms' blocks are
interleaved so drift on a shared machine hits them alike. The minimum block is the steadier estimate on a busy
machine, the median is reported beside it; `ratio` is the kernel's minimum over the stock op's minimum.

--layers splits a forward call of every built-in kernel into where its host time goes. An eager call of the public
function (`kernel`) skips the dispatcher (kernels/_dispatch.py run_directly); `op` calls `torch.ops.e2eprof.<op>`,
the path taken under torch.compile, a profiler or a dispatch mode; `impl` calls the op's Python implementation
directly; `launch` calls the device code alone, after only a view of the inputs to its 2-D or flat layout (the Triton
launcher on CUDA, cpu.py on the CPU). op - impl is the dispatcher's share, kernel - impl the public function's
routing, impl - launch the wrapper's (checks, reshapes, counters), launch the rest. It also splits the backward:
kind `fwd-grad` is the forward recording autograd's graph (dropped unused), so fwd+bwd - fwd-grad is what the
backward adds; `launch`/`bwd` is the backward's device code alone, and the backward less it is autograd's engine,
the Python backward and gradient accumulation. Arm `pynode` (softmax and LayerNorm) is the stock op's own aten
forward and backward called from a Python autograd.Function: node / stock is what a Python backward costs by itself
on this host, the floor under any kernel whose backward is Python. Arm `bare` (LayerNorm) is fastlayernorm's own
device code in such a node with nothing around it, so the kernel's excess over the floor splits into what its
device code costs and what op.py adds.

Usage (from the checkout): PYTHONPATH=$PWD python3 benchmarks/host_overhead.py --out DIR [--device cuda|cpu] [--layers]
Writes DIR/host_overhead.parquet (one row per block: kernel, arm, kind, block, us_per_call) and
DIR/host_overhead.md (the summary table, also printed).
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import sys
import time
from typing import Callable

import pandas as pd
import torch
import torch.nn.functional as F

import e2eprof.kernels.fastgelu.op as gelu_op
import e2eprof.kernels.fastlayernorm.op as layernorm_op
import e2eprof.kernels.fastsoftmax.op as softmax_op
import e2eprof.kernels.fusedsoftmax.op as fused_op
import e2eprof.kernels.rmsnorm.op as rmsnorm_op
import e2eprof.kernels.swiglu.op as swiglu_op
from e2eprof.kernels._dispatch import triton_kernels
from e2eprof.kernels.fastgelu.op import fastgelu
from e2eprof.kernels.fastlayernorm.op import fastlayernorm
from e2eprof.kernels.fastsoftmax.op import fastsoftmax
from e2eprof.kernels.fusedsoftmax.op import fusedsoftmax
from e2eprof.kernels.rmsnorm.op import rmsnorm
from e2eprof.kernels.swiglu.op import swiglu

WARMUP, CALLS, REPEATS = 100, 100, 15
SCORES = (1, 2, 4, 4)  # (B, nh, T, S): attention scores small enough that only host cost is left
HIDDEN = (1, 4, 8)  # (B, T, C) activations


def _rms_stock(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # LlamaRMSNorm.forward's body (what the rmsnorm patch replaces), without the module call around it.
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return w * h.to(x.dtype)


def _randn(device: str) -> Callable[[tuple], torch.Tensor]:
    return lambda shape: torch.randn(shape, device=device)


def _device_code(device: str) -> list:
    """What the implementations of softmax, fused softmax, GELU, LayerNorm, RMSNorm and SwiGLU (in that order) run on
    `device`: their Triton launchers on CUDA, their cpu.py on the CPU."""
    modules = (softmax_op, fused_op, gelu_op, layernorm_op, rmsnorm_op, swiglu_op)
    return [triton_kernels(m.__package__) if device == "cuda" else m.cpu for m in modules]


def _layouts(device: str) -> tuple[Callable, Callable]:
    """(as_rows, as_flat): the Triton launchers of softmax, GELU, LayerNorm and SwiGLU take any contiguous shape, as
    their ops hand it over on a GPU; the CPU code wants rows or a flat tensor."""
    if device == "cuda":
        return (lambda x: x), (lambda x: x)
    return (lambda x: x.view(-1, x.shape[-1])), (lambda x: x.view(-1))


def cases(device: str) -> dict[str, tuple[Callable, Callable, Callable[[], tuple]]]:
    """kernel -> (kernel call, stock call, inputs factory); calls take the inputs as positional arguments."""
    t = _randn(device)
    mask = torch.zeros((1, 1) + SCORES[2:], device=device)
    c = HIDDEN[-1]
    return {
        "fastsoftmax": (lambda x: fastsoftmax(x, -1), lambda x: torch.softmax(x, -1), lambda: (t(SCORES),)),
        "fusedsoftmax": (lambda x: fusedsoftmax(x, mask, 0.5), lambda x: torch.softmax(x * 0.5 + mask, -1),
                         lambda: (t(SCORES),)),
        "fastgelu": (lambda x: fastgelu(x), lambda x: F.gelu(x, approximate="tanh"), lambda: (t(HIDDEN),)),
        "fastlayernorm": (lambda x, w, b: fastlayernorm(x, c, w, b, 1e-5), lambda x, w, b: F.layer_norm(x, (c,), w, b),
                          lambda: (t(HIDDEN), t(c), t(c))),
        "rmsnorm": (lambda x, w: rmsnorm(x, w, 1e-6), _rms_stock, lambda: (t(HIDDEN), t(c))),
        "swiglu": (swiglu, lambda g, u: F.silu(g) * u, lambda: (t(HIDDEN), t(HIDDEN))),
    }


def layers(device: str) -> dict[str, tuple[Callable, Callable, Callable, Callable[[], tuple]]]:
    """kernel -> (the op through the dispatcher, the op's Python implementation, its device code alone, inputs
    factory), forward only."""
    t, c = _randn(device), HIDDEN[-1]
    as_rows, as_flat = _layouts(device)
    sm, fs, ge, ln, rn, sw = _device_code(device)
    mask = torch.zeros((1, 1) + SCORES[2:], device=device)
    ops = torch.ops.e2eprof
    return {
        "fastsoftmax": (lambda x: ops.fastsoftmax(x, -1, None), lambda x: softmax_op._fastsoftmax_impl(x, -1, None),
                        lambda x: sm.softmax_forward(as_rows(x), x.dtype), lambda: (t(SCORES),)),
        "fusedsoftmax": (lambda x: ops.fusedsoftmax(x, mask, 0.5, x.dtype),
                         lambda x: fused_op._fusedsoftmax_impl(x, mask, 0.5, x.dtype),
                         lambda x: fs.fused_softmax_forward(x, mask.expand(x.shape), 0.5, x.dtype),
                         lambda: (t(SCORES),)),
        "fastgelu": (lambda x: ops.fastgelu(x, None, "tanh"), lambda x: gelu_op._fastgelu_impl(x, None, "tanh"),
                     lambda x: ge.gelu_forward(as_flat(x), x.dtype, "tanh"), lambda: (t(HIDDEN),)),
        "fastlayernorm": (lambda x, w, b: ops.fastlayernorm(x, [c], w, b, 1e-5, None)[0],
                          lambda x, w, b: layernorm_op._fastlayernorm_impl(x, [c], w, b, 1e-5, None)[0],
                          lambda x, w, b: ln.layer_norm_forward(as_rows(x), w, b, 1e-5, x.dtype)[0],
                          lambda: (t(HIDDEN), t(c), t(c))),
        "rmsnorm": (lambda x, w: ops.rmsnorm(x, w, 1e-6), lambda x, w: rmsnorm_op._rmsnorm_impl(x, w, 1e-6),
                    lambda x, w: rn.rmsnorm_forward(x.view(-1, c), w, 1e-6), lambda: (t(HIDDEN), t(c))),
        "swiglu": (lambda g, u: ops.swiglu(g, u), swiglu_op._swiglu_impl,
                   lambda g, u: sw.swiglu_forward(as_flat(g), as_flat(u)), lambda: (t(HIDDEN), t(HIDDEN))),
    }


class _StockLayerNormInPythonNode(torch.autograd.Function):
    """aten's own LayerNorm forward and backward in a Python autograd node: the stock op's device work at a Python
    node's host cost. No kernel whose backward is Python can be cheaper than this on the host."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y, mean, rstd = torch.ops.aten.native_layer_norm(x, [x.shape[-1]], w, b, 1e-5)
        ctx.save_for_backward(x, w, b, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, w, b, mean, rstd = ctx.saved_tensors
        return tuple(torch.ops.aten.native_layer_norm_backward(dy, x, [x.shape[-1]], mean, rstd, w, b,
                                                               [True, True, True]))


class _StockSoftmaxInPythonNode(torch.autograd.Function):
    """aten's softmax forward and backward in a Python autograd node (see _StockLayerNormInPythonNode)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._softmax(x, -1, False)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten._softmax_backward_data(dy, y, -1, y.dtype)


class _LayerNormKernelsInBareNode(torch.autograd.Function):
    """fastlayernorm's own device code (the Triton launchers on CUDA, with the statistics packed as the eager call
    keeps them; cpu.py on the CPU) in a Python node with nothing around it: fastlayernorm's public call minus this
    is what op.py's routing, checks and bookkeeping add, this minus the stock op in a Python node what its device
    code's launches and allocations cost against aten's."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            y, stats, _ = triton_kernels(layernorm_op.__package__).layer_norm_forward(x, w, b, 1e-5, x.dtype, True)
            ctx.save_for_backward(x, w, stats)
            return y
        y, mean, rstd = layernorm_op.cpu.layer_norm_forward(x.view(-1, x.shape[-1]), w, b, 1e-5, x.dtype)
        ctx.save_for_backward(x, w, mean, rstd)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        if dy.is_cuda:
            x, w, stats = ctx.saved_tensors
            return triton_kernels(layernorm_op.__package__).layer_norm_backward_unchecked(
                dy, x, stats, None, w, x.dtype, w.dtype, w.dtype, shared=True)
        x, w, mean, rstd = ctx.saved_tensors
        c = x.shape[-1]
        dx, dw, db = layernorm_op.cpu.layer_norm_backward(dy.reshape(-1, c), x.view(-1, c), mean, rstd, w, x.dtype,
                                                          w.dtype, w.dtype)
        return dx.view(x.shape), dw, db


# kernel -> the stock op in a Python autograd node, whose apply takes that kernel's cases() inputs
PYTHON_NODE = {"fastsoftmax": _StockSoftmaxInPythonNode, "fastlayernorm": _StockLayerNormInPythonNode}
# kernel -> its own device code in a bare Python node (see _LayerNormKernelsInBareNode)
BARE_NODE = {"fastlayernorm": _LayerNormKernelsInBareNode}
# kernel -> the autograd.Function whose backward an eager call of it records (the direct path)
BACKWARD_FUNCTION = {"fastsoftmax": softmax_op._FastSoftmaxFunction, "fusedsoftmax": fused_op._FusedSoftmaxFunction,
                     "fastgelu": gelu_op._FastGELUFunction, "fastlayernorm": layernorm_op._FastLayerNormDirect,
                     "rmsnorm": rmsnorm_op._RMSNormFunction, "swiglu": swiglu_op._SwigluFunction}


class BodyTimed:
    """A forward + backward step whose autograd.Function's Python `backward` is timed from its first line to its
    return, on whichever thread autograd runs it (its device thread on CUDA): `body_ns` adds up across calls. The
    rest of the backward is autograd's engine, the Python node around the body and gradient accumulation."""

    def __init__(self, step: Callable[[], None], function: type) -> None:
        self.step, self.function, self.body_ns = step, function, 0

    @contextlib.contextmanager
    def timing(self):
        original = self.function.__dict__["backward"]  # the staticmethod; autograd looks it up on every backward
        body = original.__func__

        def backward(ctx, *grads):
            t0 = time.perf_counter_ns()
            try:
                return body(ctx, *grads)
            finally:
                self.body_ns += time.perf_counter_ns() - t0

        self.function.backward = staticmethod(backward)
        try:
            yield
        finally:
            self.function.backward = original

    def __call__(self) -> None:
        self.step()


def backward_layers(device: str) -> dict[str, tuple[Callable, Callable[[], tuple]]]:
    """kernel -> (its backward's device code alone, inputs factory): what a backward call launches, without autograd,
    the op or the checks an eager call's backward skips (the Triton launcher on CUDA, cpu.py on the CPU)."""
    t, c = _randn(device), HIDDEN[-1]
    as_rows, as_flat = _layouts(device)
    sm, fs, ge, ln, rn, sw = _device_code(device)

    def layer_norm_inputs() -> tuple:
        x, w, b = t(HIDDEN), t(c), t(c)
        # As the eager forward saves them: packed on CUDA (one statistics tensor, rstd None), two tensors otherwise.
        packed = {"packed": True} if device == "cuda" else {}  # cpu.py's forward has no packed form
        _, mean, rstd = ln.layer_norm_forward(as_rows(x), w, b, 1e-5, x.dtype, **packed)
        return t(HIDDEN), x, mean, rstd, w

    # On CUDA, the eager backward's own call (op.py's _gradients): no checks, dweight and dbias views of one result.
    if device == "cuda":
        def layer_norm_bwd(dy, x, mean, rstd, w):
            return ln.layer_norm_backward_unchecked(dy, x, mean, rstd, w, x.dtype, w.dtype, w.dtype, shared=True)
    else:
        def layer_norm_bwd(dy, x, mean, rstd, w):
            return ln.layer_norm_backward(as_rows(dy), as_rows(x), mean, rstd, w, x.dtype, w.dtype, w.dtype)
    return {
        "fastsoftmax": (lambda dy, y: sm.softmax_backward(as_rows(dy), as_rows(y), y.dtype),
                        lambda: (t(SCORES), torch.softmax(t(SCORES), -1))),
        "fusedsoftmax": (lambda dy, y: fs.fused_softmax_backward(dy, y, 0.5, y.dtype),
                         lambda: (t(SCORES), torch.softmax(t(SCORES), -1))),
        "fastgelu": (lambda dy, x: ge.gelu_backward(as_flat(dy), as_flat(x), x.dtype, "tanh"),
                     lambda: (t(HIDDEN), t(HIDDEN))),
        "fastlayernorm": (layer_norm_bwd, layer_norm_inputs),
        "rmsnorm": (lambda dy, x, w: rn.rmsnorm_backward(dy.view(-1, c), x.view(-1, c), w, 1e-6),
                    lambda: (t(HIDDEN), t(HIDDEN), t(c))),
        "swiglu": (lambda dy, g, u: sw.swiglu_backward(as_flat(dy), as_flat(g), as_flat(u)),
                   lambda: (t(HIDDEN), t(HIDDEN), t(HIDDEN))),
    }


def steps(call: Callable, make: Callable[[], tuple]) -> dict[str, Callable[[], None]]:
    """One call forward only (no grad); the same call recording autograd's graph, which is dropped unused
    (fwd-grad); and one forward + backward through every input. fwd+bwd - fwd-grad is the backward's share."""
    args = make()
    gargs = tuple(a.clone().requires_grad_() for a in args)
    grad = torch.ones_like(call(*args))

    def forward_recorded() -> None:
        call(*gargs)

    def forward_backward() -> None:
        call(*gargs).backward(grad)

    return {"fwd": _no_grad_call(call, args), "fwd-grad": forward_recorded, "fwd+bwd": forward_backward}


def _no_grad_call(call: Callable, args: tuple) -> Callable[[], None]:
    def run() -> None:
        with torch.no_grad():
            call(*args)
    return run


def block_us(step: Callable[[], None], sync: Callable[[], None]) -> float:
    """Microseconds per call of `step` over one block of CALLS calls; the device queue is drained before, not during."""
    sync()
    t0 = time.perf_counter_ns()
    for _ in range(CALLS):
        step()
    return (time.perf_counter_ns() - t0) / CALLS / 1e3


def measure(device: str, kernels: list[str], split: bool = False) -> pd.DataFrame:
    """Raw per-call times, one row per (kernel, arm, kind, block); every step's blocks interleaved.
    split: also the arms "op", "impl" and "launch" (forward) of the kernels `layers` knows."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    table = cases(device)
    parts = layers(device) if split else {}
    backward_parts = backward_layers(device) if split else {}
    calls = {}
    for kernel in kernels:
        ours, stock, make = table[kernel]
        for arm, call in (("kernel", ours), ("stock", stock)):
            for kind, step in steps(call, make).items():
                calls[kernel, arm, kind] = step
        if kernel in parts:
            op, impl, launch, make_split = parts[kernel]
            for arm, call in (("op", op), ("impl", impl), ("launch", launch)):
                calls[kernel, arm, "fwd"] = steps(call, make_split)["fwd"]
        if kernel in backward_parts:
            call, make_bwd = backward_parts[kernel]
            calls[kernel, "launch", "bwd"] = _no_grad_call(call, make_bwd())
        for arm, nodes in (("pynode", PYTHON_NODE), ("bare", BARE_NODE)):
            if split and kernel in nodes:
                node = nodes[kernel]
                for kind, step in steps(node.apply, make).items():
                    if kind != "fwd":  # without grad no node is built: only what it wraps runs
                        calls[kernel, arm, kind] = step
                calls[kernel, arm, "bwd-body"] = BodyTimed(calls[kernel, arm, "fwd+bwd"], node)
        if split and kernel in BACKWARD_FUNCTION:
            function = BACKWARD_FUNCTION[kernel]
            calls[kernel, "kernel", "bwd-body"] = BodyTimed(calls[kernel, "kernel", "fwd+bwd"], function)
    for step in calls.values():
        with _body_timing(step):
            for _ in range(WARMUP):
                step()
    rows = []
    for block in range(REPEATS):
        for (kernel, arm, kind), step in calls.items():
            if isinstance(step, BodyTimed):  # the body's share of each call, not the block's wall time
                step.body_ns = 0
                with step.timing():
                    block_us(step, sync)
                us = step.body_ns / CALLS / 1e3
            else:
                us = block_us(step, sync)
            rows.append({"kernel": kernel, "arm": arm, "kind": kind, "block": block, "us_per_call": us})
    sync()
    return pd.DataFrame(rows)


def _body_timing(step):
    return step.timing() if isinstance(step, BodyTimed) else contextlib.nullcontext()


def summary(raw: pd.DataFrame) -> pd.DataFrame:
    """Per kernel and kind: median and minimum of each arm, and the kernel/stock ratio of the minima."""
    raw = raw[raw.arm.isin(["kernel", "stock"]) & raw.kind.isin(["fwd", "fwd-grad", "fwd+bwd"])]
    agg = raw.groupby(["kernel", "kind", "arm"], sort=False)["us_per_call"].agg(["median", "min"]).unstack("arm")
    out = pd.DataFrame({
        "kernel_us_min": agg["min"]["kernel"], "kernel_us_median": agg["median"]["kernel"],
        "stock_us_min": agg["min"]["stock"], "stock_us_median": agg["median"]["stock"],
    })
    out["ratio"] = out["kernel_us_min"] / out["stock_us_min"]
    return out.reset_index()


def layers_markdown(raw: pd.DataFrame) -> str:
    """The forward call split into routing, dispatcher, wrapper and device code (minimum of the blocks), where
    measured."""
    fwd = raw[raw.kind == "fwd"].groupby(["kernel", "arm"], sort=False)["us_per_call"].min().unstack("arm")
    if "impl" not in fwd:
        return ""
    fwd = fwd.dropna(subset=["op", "impl", "launch"])
    lines = [f"| {k} | {r.kernel:.1f} | {r.kernel - r.impl:.1f} | {r.op:.1f} | {r.op - r.impl:.1f} | "
             f"{r.impl - r.launch:.1f} | {r.launch:.1f} | {r.stock:.1f} |" for k, r in fwd.iterrows()]
    return ("\nForward call by layer, min us: call = routing (call - impl) + wrapper (impl - launch) + device code "
            "(launch); through torch.ops (compile, profiler, modes) = dispatcher (op - impl) + wrapper + device code"
            "\n\n| kernel | call | routing | via torch.ops | dispatcher | wrapper | device code | stock op |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|\n" + "\n".join(lines) + "\n")


def backward_markdown(raw: pd.DataFrame) -> str:
    """The backward's share of forward + backward (fwd+bwd - fwd-grad), split into its device code and the rest
    (autograd's engine, the Python backward, gradient accumulation), minimum of the blocks, where measured."""
    mins = raw.groupby(["kernel", "arm", "kind"], sort=False)["us_per_call"].min()
    lines = []
    for kernel in raw.kernel.unique():
        try:
            total, recorded = mins[kernel, "kernel", "fwd+bwd"], mins[kernel, "kernel", "fwd-grad"]
            device_code, body = mins[kernel, "launch", "bwd"], mins[kernel, "kernel", "bwd-body"]
            stock_total, stock_recorded = mins[kernel, "stock", "fwd+bwd"], mins[kernel, "stock", "fwd-grad"]
        except KeyError:
            continue
        backward, stock_backward = total - recorded, stock_total - stock_recorded
        lines.append(f"| {kernel} | {total:.1f} | {recorded:.1f} | {backward:.1f} | {device_code:.1f} | "
                     f"{backward - device_code:.1f} | {body:.1f} | {backward - body:.1f} | {stock_recorded:.1f} | "
                     f"{stock_backward:.1f} |")
        for arm, label in (("bare", "its device code in a bare Python node"), ("pynode", "stock in a Python node")):
            if (kernel, arm, "bwd-body") not in mins.index:  # the same split of a plain node, for scale
                continue
            node_total, node_recorded = mins[kernel, arm, "fwd+bwd"], mins[kernel, arm, "fwd-grad"]
            node_body, node_backward = mins[kernel, arm, "bwd-body"], node_total - node_recorded
            lines.append(f"| {kernel}: {label} | {node_total:.1f} | {node_recorded:.1f} | "
                         f"{node_backward:.1f} | - | - | {node_body:.1f} | {node_backward - node_body:.1f} | "
                         f"{stock_recorded:.1f} | {stock_backward:.1f} |")
    if not lines:
        return ""
    return ("\nForward + backward by part, min us: backward = fwd+bwd - fwd-grad (the forward recording the graph); "
            "rest = backward - its device code (autograd's engine, the Python backward, gradient accumulation); "
            "body = the Function's Python backward from its first line to its return (device code included), "
            "outside = backward - body (autograd's engine, the Python node around the body, gradient accumulation)"
            "\n\n| kernel | fwd+bwd | fwd-grad | backward | device code | rest | body | outside | stock fwd-grad | "
            "stock backward |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n" + "\n".join(lines) + "\n")


def python_node_markdown(raw: pd.DataFrame) -> str:
    """The stock op's own forward and backward in a Python autograd node against the stock op (minimum of the
    blocks): the host cost a Python backward adds by itself, which bounds what any Python-autograd kernel can reach."""
    mins = raw.groupby(["kernel", "arm", "kind"], sort=False)["us_per_call"].min()
    lines = []
    for kernel in raw.kernel.unique():
        for kind in ("fwd-grad", "fwd+bwd"):
            try:
                node, stock = mins[kernel, "pynode", kind], mins[kernel, "stock", kind]
                ours = mins[kernel, "kernel", kind]
            except KeyError:
                continue
            lines.append(f"| {kernel} | {kind} | {stock:.1f} | {node:.1f} | {node / stock:.2f} | {ours:.1f} | "
                         f"{ours / node:.2f} |")
    if not lines:
        return ""
    return ("\nThe stock op in a Python autograd node (aten's forward and backward called from an autograd.Function), "
            "min us: node / stock is what a Python backward costs by itself; kernel / node what the kernel adds to it"
            "\n\n| kernel | kind | stock | stock in a Python node | node / stock | kernel | kernel / node |\n"
            "|---|---|---:|---:|---:|---:|---:|\n" + "\n".join(lines) + "\n")


def markdown(table: pd.DataFrame, device: str) -> str:
    head = (f"Host us per call on {device} ({torch.__version__}), tiny tensors, {REPEATS} blocks of {CALLS} calls; "
            "min (median); ratio = kernel min / stock min\n\n"
            "| kernel | kind | kernel us | stock us | ratio |\n|---|---|---:|---:|---:|\n")
    lines = [f"| {r.kernel} | {r.kind} | {r.kernel_us_min:.1f} ({r.kernel_us_median:.1f}) | "
             f"{r.stock_us_min:.1f} ({r.stock_us_median:.1f}) | {r.ratio:.2f} |" for r in table.itertuples()]
    return head + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    names = list(cases("cpu"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, required=True, help="folder for host_overhead.{parquet,md}")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--kernels", default=",".join(names), help=f"comma-separated subset of {','.join(names)}")
    parser.add_argument("--layers", action="store_true",
                        help="also split the forward call by layer and the backward into device code and the rest")
    args = parser.parse_args(argv)
    chosen = [k.strip() for k in args.kernels.split(",") if k.strip()]
    unknown = sorted(set(chosen) - set(names))
    if unknown or not chosen:
        parser.error(f"unknown kernel(s) {unknown}; choose from {names}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but CUDA is not available")
    torch.set_num_threads(1)  # a busy machine disturbs one thread less
    raw = measure(args.device, chosen, split=args.layers)
    table = summary(raw)
    text = (markdown(table, torch.cuda.get_device_name() if args.device == "cuda" else "cpu") + layers_markdown(raw)
            + backward_markdown(raw) + python_node_markdown(raw))
    args.out.mkdir(parents=True, exist_ok=True)
    raw.to_parquet(args.out / "host_overhead.parquet", index=False)
    (args.out / "host_overhead.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
