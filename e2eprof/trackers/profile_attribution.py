"""How one profile's events become its tables (ProfileResult): each op's module, direction and device time.

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

import math
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass, field

import torch

MODULE_PREFIX = "module::"
REPLACED_PREFIX = "e2eprof.replaced::"
ROOT = "<root>"  # the model itself (named_modules path "")
OUTSIDE = "<outside>"  # forward-side work outside the model: optimizer, zero_grad, host-to-device copy, step overhead
UNATTRIBUTED = "<unattributed>"  # backward work with no forward op to link to, kernels with no launching op
UNLINKED_KERNELS_OP = "<kernels without a launching op>"
BACKWARD_SCOPE = 1  # at::RecordScope::BACKWARD_FUNCTION
_EVALUATE_FUNCTION = "autograd::engine::evaluate_function:"


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
