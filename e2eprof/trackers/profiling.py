"""The profiling phase of one arm: per-op and per-kernel tables keyed by module path, op and input shapes.

Runs inside the arm's worker process after timing (a profiler perturbs timing). `profile_workload` runs a few real
steps under `torch.profiler` with `record_function` ranges around every submodule's forward (`module_ranges`) and
returns a picklable `ProfileResult`.

Attribution. Every CPU event gets a context (module, in_replaced, direction) from its nearest enclosing ranges:
- "module::<path>" ranges (pushed by forward hooks) and "e2eprof.replaced::<patch>" ranges (pushed around every call
  of the patched function, in both arms) set the module; the innermost wins. Any enclosing replaced range sets
  in_replaced.
- Autograd runs backward outside those ranges (on CUDA, on another thread). Each backward node event
  ("autograd::engine::evaluate_function: XBackward0" and the node's own "XBackward0", scope BACKWARD_FUNCTION) carries
  the `sequence_nr` of the node and `fwd_thread`, the thread that ran the forward. The forward op that created the
  node carries the same `sequence_nr` on that thread (the dispatcher stamps every op it sends through autograd with
  the number the next node will get, so among forward events with sequence number N the last one to start is the
  one that created node N). Ops below a backward node inherit that forward op's module and in_replaced flag, with
  direction "bwd". Nodes with no forward op (AccumulateGrad) go under "<unattributed>".
Device time. Kineto attaches each kernel to the innermost CPU event whose correlation id it carries (an aten op, or a
range when a kernel is launched directly from Python, e.g. a bare Triton launch). An op's self device time is the sum
of its own kernels, which is exactly FunctionEvent.self_device_time_total (exclusive; inclusive times are never
added). Device time of kernels that no CPU event launched is kept as an "<unattributed>" row, so the op table always
sums to the trace's total device time.

All times in ProfileResult are microseconds per active step unless a name says otherwise.
"""

from __future__ import annotations

import contextlib
import gzip
import math
import os
import shutil
import statistics
import tempfile
import threading
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.autograd.profiler import record_function

MODULE_PREFIX = "module::"
REPLACED_PREFIX = "e2eprof.replaced::"
ROOT = "<root>"  # the model itself (named_modules path "")
OUTSIDE = "<outside>"  # forward-side work outside the model: optimizer, zero_grad, host-to-device copy, step overhead
UNATTRIBUTED = "<unattributed>"  # backward work with no forward op to link to, kernels with no launching op
UNLINKED_KERNELS_OP = "<kernels without a launching op>"
BACKWARD_SCOPE = 1  # at::RecordScope::BACKWARD_FUNCTION
_EVALUATE_FUNCTION = "autograd::engine::evaluate_function:"

DEFAULT_TRACE_MAX_BYTES = 200 * 1024 * 1024


# ---- ranges ---------------------------------------------------------------------------------------------------


def replaced_region(name: str) -> record_function:
    """The range every call of patch `name`'s target runs inside, in both arms ("e2eprof.replaced::<name>").

    The patched arm opens it around the replacement, the baseline arm around the stock function (a pass-through
    recorder), so the replaced region is measured the same way in both.
    """
    return record_function(REPLACED_PREFIX + name)


@contextlib.contextmanager
def module_ranges(model: torch.nn.Module) -> Iterator[None]:
    """Push a "module::<path>" range for the duration of every submodule's forward; remove the hooks on exit.

    Paths come from `named_modules` ("transformer.h.3.attn"; the model itself is "<root>"). Forward hooks are
    registered with always_call=True so a forward that raises still closes its range; a range whose post-hook never
    ran (a hook skipped, a module re-entered) is closed when an outer module's post-hook or this context's exit finds
    it still open, innermost first.
    """
    local = threading.local()

    def stack() -> list[tuple[int, record_function]]:
        if not hasattr(local, "stack"):
            local.stack = []
        return local.stack

    def make_pre(name: str) -> Callable:
        def pre_hook(module, args):
            rf = record_function(name)
            rf.__enter__()
            stack().append((id(module), rf))

        return pre_hook

    def post_hook(module, args, output):
        open_ranges = stack()
        key = id(module)
        if not any(k == key for k, _ in open_ranges):
            return  # no matching pre-hook (hooks were added mid-forward): nothing to close
        while open_ranges:
            k, rf = open_ranges.pop()
            _close(rf)
            if k == key:
                break

    handles = []
    try:
        for path, sub in model.named_modules():
            handles.append(sub.register_forward_pre_hook(make_pre(MODULE_PREFIX + (path or ROOT))))
            try:
                handles.append(sub.register_forward_hook(post_hook, always_call=True))
            except TypeError:  # torch < 2.1 has no always_call; exceptions then leave ranges to the exit below
                handles.append(sub.register_forward_hook(post_hook))
        yield
    finally:
        for handle in handles:
            handle.remove()
        leftover = stack()
        while leftover:
            _close(leftover.pop()[1])


def _close(rf: record_function) -> None:
    try:
        rf.__exit__(None, None, None)
    except Exception:  # closing a range must never mask the step's own error
        pass


# ---- result ---------------------------------------------------------------------------------------------------


@dataclass
class ProfileResult:
    """What one arm's profiling phase measured; plain lists of dicts and floats so it pickles across the pipe.

    ops: one row per (module, op, input_shapes, in_replaced, direction) with count, self_device_us, self_cpu_us
        (per active step) and kernels (sorted unique kernel names joined by ';').
    kernels: one row per (kernel, op) with calls and total_us per active step and median_us over all launches.
    total_device_us: device time per step (every kernel, copy and memset in the trace; 0 on CPU).
    total_cpu_us: self CPU time of every CPU event per step, all threads together.
    step_wall_us: mean wall time of the active steps (step_walls_us: each of them).
    idle_share: fraction of the active steps' wall span with no device activity at all (NaN on CPU).
    replaced_*_us: per step, inside "e2eprof.replaced::" ranges, forward plus the backward ops linked to them; the
        _fwd_ / _bwd_ fields split them by direction.
    unattributed_*: per step, work under "<unattributed>"; unattributed_events counts its CPU events (all steps).
    comm_cpu_us: per step, time of the collectives gloo ran on its own threads (data-parallel CPU runs; on a GPU
        the NCCL kernels are in `kernels`).
    """

    device_type: str
    torch_version: str
    active_steps: int
    ops: list[dict] = field(default_factory=list)
    kernels: list[dict] = field(default_factory=list)
    total_device_us: float = 0.0
    total_cpu_us: float = 0.0
    step_wall_us: float = math.nan
    step_walls_us: list[float] = field(default_factory=list)
    idle_share: float = math.nan
    replaced_device_us: float = 0.0
    replaced_cpu_us: float = 0.0
    replaced_fwd_device_us: float = 0.0
    replaced_bwd_device_us: float = 0.0
    replaced_fwd_cpu_us: float = 0.0
    replaced_bwd_cpu_us: float = 0.0
    unattributed_device_us: float = 0.0
    unattributed_cpu_us: float = 0.0
    unattributed_events: int = 0
    unlinked_kernel_us: float = 0.0
    comm_cpu_us: float = 0.0
    trace_path: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ProfileResult:
        return cls(**data)


# ---- profiling ------------------------------------------------------------------------------------------------


def profile_workload(
    step_fn: Callable[[], Any],
    model: torch.nn.Module,
    *,
    device: torch.device,
    warmup: int = 2,
    active: int = 3,
    trace_path: str | None = None,
    trace_max_bytes: int = DEFAULT_TRACE_MAX_BYTES,
    with_module_ranges: bool = True,
) -> ProfileResult:
    """Run `warmup + active` real steps under torch.profiler and summarise the active ones.

    step_fn runs one real step (a closure over Workload.step and a batch). On CUDA the device is synchronized after
    every step, so each step's kernels land inside its own ProfilerStep range. With trace_path, the active steps'
    Chrome trace is written there gzipped (skipped with a note when larger than trace_max_bytes).
    with_module_ranges=False leaves the model's modules alone (a torch.compile'd model would graph-break on the
    hooks); its ops then fall under "<outside>" and check_complete says no op was attributed to a module.
    """
    if active < 1 or warmup < 0:
        raise ValueError(f"need active >= 1 and warmup >= 0, got active={active}, warmup={warmup}")
    device = torch.device(device)
    cuda = device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    results: list[ProfileResult] = []

    def on_trace_ready(prof) -> None:
        result = summarize_events(prof.events(), device_type=device.type, active_steps=active)
        if trace_path is not None:
            saved, note = export_trace(prof, trace_path, trace_max_bytes)
            result.trace_path = saved
            if note:
                result.notes.append(note)
        results.append(result)

    with warnings.catch_warnings():
        # "Profiler clears events at the end of each cycle": expected, we read the events in on_trace_ready.
        warnings.filterwarnings("ignore", message=".*clears events at the end of each cycle.*")
        ranges = module_ranges(model) if with_module_ranges else contextlib.nullcontext()
        with ranges, torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=0, warmup=warmup, active=active, repeat=1),
            on_trace_ready=on_trace_ready,
            record_shapes=True,
        ) as prof:
            for _ in range(warmup + active):
                step_fn()
                if cuda:
                    torch.cuda.synchronize(device)
                prof.step()
    if not results:
        raise RuntimeError("the profiler delivered no trace (its schedule never reached the end of the active steps)")
    return results[0]


def export_trace(prof, path: str, max_bytes: int) -> tuple[str | None, str]:
    """Write the profiler's Chrome trace to `path` gzipped; return (path or None, note).

    The trace is written to a temporary file first and compressed; when the compressed trace is larger than
    max_bytes nothing is kept and the note says so (5 Llama-7B steps make a 4 GB trace).
    """
    if not path.endswith(".gz"):
        path += ".gz"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "trace.json")
        try:
            prof.export_chrome_trace(raw)
        except Exception as exc:
            return None, f"trace not exported: {type(exc).__name__}: {exc}"
        packed = os.path.join(tmp, "trace.json.gz")
        with open(raw, "rb") as src, gzip.open(packed, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, length=1 << 20)
        size = os.path.getsize(packed)
        if size > max_bytes:
            return None, f"trace not kept: {size / 2**20:.1f} MiB gzipped exceeds the {max_bytes / 2**20:.1f} MiB limit"
        shutil.move(packed, path)
    return path, ""


# ---- attribution ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Ctx:
    module: str
    in_replaced: bool
    direction: str  # "fwd" | "bwd"


_TOP = _Ctx(OUTSIDE, False, "fwd")


def _is_cpu(evt) -> bool:
    return getattr(evt, "device_type", None) == torch.autograd.DeviceType.CPU


def _is_backward_node(evt) -> bool:
    return getattr(evt, "scope", 0) == BACKWARD_SCOPE or evt.name.startswith(_EVALUATE_FUNCTION)


def _self_device_us(evt) -> float:
    # == FunctionEvent.self_device_time_total for kineto events: kernels attach to the innermost CPU event only, so
    # an event's own kernels are its exclusive device time. Summed directly: the property recomputes whole subtrees.
    if getattr(evt, "is_legacy", False):
        value = getattr(evt, "self_device_time_total", None)
        if value is None:  # torch < 2.4
            value = getattr(evt, "self_cuda_time_total", 0.0)
        return float(value)
    return float(sum(k.duration for k in getattr(evt, "kernels", ())))


def _op_name(evt) -> str:
    name = evt.name
    if name.startswith("ProfilerStep"):
        return "ProfilerStep"  # "ProfilerStep#7" (or "ProfilerStep*"): one row, not one per step
    return name


def _shapes(evt) -> str:
    shapes = getattr(evt, "input_shapes", None)
    return str(list(shapes)) if shapes else "[]"


class _Attributor:
    """Assigns a _Ctx to every CPU event; see the module docstring for the rules."""

    def __init__(self):
        self.ctx: dict[int, _Ctx] = {}
        # (sequence_nr, forward thread) -> context of the last forward event stamped with it
        self.forward: dict[tuple[int, int], _Ctx] = {}
        self.forward_by_seq: dict[int, set[int]] = defaultdict(set)
        self.unlinked_nodes: int = 0

    def context(self, evt) -> _Ctx:
        # Walk up to the nearest event with a known context (parents usually come first in time order, but an
        # event can share its parent's start and end), then fill the chain downwards.
        chain = []
        node = evt
        while node is not None and id(node) not in self.ctx:
            chain.append(node)
            node = node.cpu_parent
        current = self.ctx[id(node)] if node is not None else _TOP
        for item in reversed(chain):
            current = self._derive(item, current)
            self.ctx[id(item)] = current
        return current

    def _derive(self, evt, parent: _Ctx) -> _Ctx:
        name = evt.name
        if name.startswith(MODULE_PREFIX):
            return _Ctx(name[len(MODULE_PREFIX):], parent.in_replaced, parent.direction)
        if name.startswith(REPLACED_PREFIX):
            return _Ctx(name, True, parent.direction)
        if _is_backward_node(evt):
            seq = getattr(evt, "sequence_nr", -1)
            if seq is not None and seq >= 0:
                linked = self._link(seq, getattr(evt, "fwd_thread", None))
                if linked is not None:
                    return _Ctx(linked.module, linked.in_replaced, "bwd")
            if parent.direction == "bwd":
                return parent  # e.g. the node's own event inside its evaluate_function: already linked
            self.unlinked_nodes += 1
            return _Ctx(UNATTRIBUTED, False, "bwd")
        return parent

    def _link(self, seq: int, fwd_thread) -> _Ctx | None:
        if fwd_thread is not None:
            found = self.forward.get((seq, fwd_thread))
            if found is not None:
                return found
        threads = self.forward_by_seq.get(seq, ())
        if len(threads) == 1:  # fwd_thread missing or in another id space: unambiguous by sequence number alone
            return self.forward[(seq, next(iter(threads)))]
        return None

    def note_forward(self, evt, ctx: _Ctx) -> None:
        seq = getattr(evt, "sequence_nr", -1)
        if ctx.direction == "fwd" and seq is not None and seq >= 0 and not _is_backward_node(evt):
            # Later events with the same number overwrite earlier ones: the last to start created the node.
            self.forward[(seq, evt.thread)] = ctx
            self.forward_by_seq[seq].add(evt.thread)


def summarize_events(events, *, device_type: str, active_steps: int) -> ProfileResult:
    """Build a ProfileResult from a profiler's FunctionEvents (the active steps of one schedule cycle)."""
    n = max(int(active_steps), 1)
    result = ProfileResult(device_type=device_type, torch_version=torch.__version__, active_steps=n)
    cpu_events = [e for e in events if _is_cpu(e) and not getattr(e, "is_async", False)]
    device_events = [
        e for e in events
        if not _is_cpu(e) and not getattr(e, "is_user_annotation", False)
        and getattr(e, "activity_type", None) != "gpu_user_annotation"
    ]
    # Time order: forward ops start before the backward nodes that link to them.
    cpu_events.sort(key=lambda e: (e.time_range.start, -e.time_range.end))

    attributor = _Attributor()
    rows: dict[tuple, dict] = {}
    kernel_durations: dict[tuple[str, str], list[float]] = defaultdict(list)
    for evt in cpu_events:
        ctx = attributor.context(evt)
        attributor.note_forward(evt, ctx)
        key = (ctx.module, _op_name(evt), _shapes(evt), ctx.in_replaced, ctx.direction)
        row = rows.get(key)
        if row is None:
            row = rows[key] = {"count": 0, "self_device_us": 0.0, "self_cpu_us": 0.0, "kernels": set()}
        row["count"] += 1
        row["self_device_us"] += _self_device_us(evt)
        row["self_cpu_us"] += float(evt.self_cpu_time_total)
        for kernel in getattr(evt, "kernels", ()):
            row["kernels"].add(kernel.name)
            kernel_durations[(kernel.name, evt.name)].append(float(kernel.duration))
        if ctx.module == UNATTRIBUTED:
            result.unattributed_events += 1

    # Device activity: total, the part no CPU event launched, and how much of the steps' span it covers.
    total_device = sum(e.time_range.end - e.time_range.start for e in device_events)
    attributed_device = sum(r["self_device_us"] for r in rows.values())
    unlinked = total_device - attributed_device
    if unlinked > max(1e-6 * total_device, 0.5):
        key = (UNATTRIBUTED, UNLINKED_KERNELS_OP, "[]", False, "fwd")
        rows[key] = {"count": 0, "self_device_us": unlinked, "self_cpu_us": 0.0, "kernels": set()}
        result.unlinked_kernel_us = unlinked / n
    elif unlinked < -max(1e-3 * total_device, 1.0):
        result.notes.append(f"ops carry {-unlinked:.1f} us more device time than the trace's device events "
                            "(a kernel attached twice?); totals use the device events")
    if attributor.unlinked_nodes:
        result.notes.append(f"{attributor.unlinked_nodes} backward nodes had no forward op to link to "
                            f"(AccumulateGrad and the like); their work is under {UNATTRIBUTED}")

    result.ops = [
        {"module": k[0], "op": k[1], "input_shapes": k[2], "in_replaced": k[3], "direction": k[4],
         "count": r["count"] / n, "self_device_us": r["self_device_us"] / n, "self_cpu_us": r["self_cpu_us"] / n,
         "kernels": ";".join(sorted(r["kernels"]))}
        for k, r in rows.items()
    ]
    result.kernels = [
        {"kernel": name, "op": op, "calls": len(d) / n, "total_us": sum(d) / n, "median_us": statistics.median(d)}
        for (name, op), d in sorted(kernel_durations.items())
    ]
    if unlinked > max(1e-6 * total_device, 0.5):
        linked_ids = {e.id for e in cpu_events}
        orphans: dict[str, list[float]] = defaultdict(list)
        for e in device_events:
            if getattr(e, "linked_correlation_id", 0) not in linked_ids:
                orphans[e.name].append(e.time_range.end - e.time_range.start)
        for name, d in sorted(orphans.items()):
            result.kernels.append({"kernel": name, "op": UNLINKED_KERNELS_OP, "calls": len(d) / n,
                                   "total_us": sum(d) / n, "median_us": statistics.median(d)})

    result.total_device_us = total_device / n
    # gloo runs collectives on its own threads; the profiler shows them only as async "gloo:<collective>" events.
    result.comm_cpu_us = sum(e.time_range.end - e.time_range.start for e in events
                             if _is_cpu(e) and getattr(e, "is_async", False) and e.name.startswith("gloo:")) / n
    result.total_cpu_us = sum(r["self_cpu_us"] for r in result.ops)
    for row in result.ops:
        if row["in_replaced"]:
            device_us, cpu_us = row["self_device_us"], row["self_cpu_us"]
            result.replaced_device_us += device_us
            result.replaced_cpu_us += cpu_us
            if row["direction"] == "bwd":
                result.replaced_bwd_device_us += device_us
                result.replaced_bwd_cpu_us += cpu_us
            else:
                result.replaced_fwd_device_us += device_us
                result.replaced_fwd_cpu_us += cpu_us
        if row["module"] == UNATTRIBUTED:
            result.unattributed_device_us += row["self_device_us"]
            result.unattributed_cpu_us += row["self_cpu_us"]

    steps = sorted((e for e in cpu_events if e.name.startswith("ProfilerStep")), key=lambda e: e.time_range.start)
    result.step_walls_us = [float(e.time_range.end - e.time_range.start) for e in steps]
    if steps:
        result.step_wall_us = statistics.fmean(result.step_walls_us)
        if len(steps) != n:
            result.notes.append(f"the trace holds {len(steps)} ProfilerStep ranges for {n} active steps")
        if device_type != "cpu":
            span = (steps[0].time_range.start, max(e.time_range.end for e in steps))
            result.idle_share = _idle_share(device_events, span)
    else:
        result.notes.append("no ProfilerStep ranges in the trace: step wall time and idle share are unknown")
    return result


def _idle_share(device_events, span: tuple[float, float]) -> float:
    """Fraction of `span` (us) covered by no device event: 1 - |union of intervals within span| / |span|."""
    lo, hi = span
    if hi <= lo:
        return math.nan
    intervals = sorted(
        (max(e.time_range.start, lo), min(e.time_range.end, hi)) for e in device_events
        if e.time_range.end > lo and e.time_range.start < hi
    )
    busy = 0.0
    cur_start = cur_end = None
    for start, end in intervals:
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                busy += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        busy += cur_end - cur_start
    return max(0.0, 1.0 - busy / (hi - lo))


# ---- completeness ---------------------------------------------------------------------------------------------


def check_complete(result: ProfileResult | dict, *, device_type: str,
                   expected_kernel_substrings: tuple[str, ...] = (), expect_modules: bool = True) -> list[str]:
    """Problems that make a profile unusable as evidence; an empty list means complete.

    - no ops at all, or (when module ranges were recorded: expect_modules) none attributed to a model module;
    - on CUDA, zero device time;
    - an expected kernel name (substring) absent from the trace's kernels (the patched arm must show its custom
      kernel). On CPU there are no device kernels, so op names are searched instead (a custom op shows there).
    """
    data = result.to_dict() if isinstance(result, ProfileResult) else dict(result)
    problems: list[str] = []
    ops = data.get("ops") or []
    if not ops:
        problems.append("the profile holds no ops")
    elif expect_modules and not any(row["module"] not in (OUTSIDE, UNATTRIBUTED) for row in ops):
        problems.append("no op was attributed to any module of the model (module ranges missing?)")
    total = data.get("total_device_us", 0.0)
    if device_type == "cuda" and not (isinstance(total, (int, float)) and total > 0):
        problems.append("zero device time on CUDA: the trace has no kernels (CUPTI unavailable or not recording?)")
    names = [row["kernel"] for row in data.get("kernels") or []]
    if device_type == "cpu":
        names += [row["op"] for row in ops]
    for sub in expected_kernel_substrings:
        if not any(sub in name for name in names):
            where = "kernel or op" if device_type == "cpu" else "kernel"
            problems.append(f"expected {where} '{sub}' not found in the trace (did the custom kernel run?)")
    return problems
