"""The profiling phase of one arm: per-op and per-kernel tables keyed by module path, op and input shapes.

Runs inside the arm's worker process after timing (a profiler perturbs timing). `profile_workload` runs a few real
steps under `torch.profiler` with `record_function` ranges around every submodule's forward (`module_ranges`) and
returns a picklable `ProfileResult`; how its events become those tables is e2eprof.trackers.profile_attribution.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.autograd.profiler import record_function

# Re-exported: callers read the result, its names and the attribution from here.
from e2eprof.trackers.profile_attribution import (
    MODULE_PREFIX, OUTSIDE, REPLACED_PREFIX, ROOT, UNATTRIBUTED, ProfileResult, summarize_events,
)

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

# ---- profiling ------------------------------------------------------------------------------------------------


class RecordedProfile:
    """The active steps of one profiler run, held as the profiler left them until `summarize` reads them.

    Reading the events (torch builds a Python object per event, then the attribution below runs over them) costs
    seconds per arm: a run records every arm's profile in turn and then summarises them all at once, each in its own
    process, so that cost overlaps instead of adding up. Nothing is measured while they summarise.
    """

    def __init__(self, prof, *, device_type: str, active: int, trace_path: str | None, trace_max_bytes: int):
        self._prof = prof
        self._device_type = device_type
        self._active = active
        self._trace_path = trace_path
        self._trace_max_bytes = trace_max_bytes

    def summarize(self) -> ProfileResult:
        """The ProfileResult of the recorded steps (and their Chrome trace written, when a path was given)."""
        if self._prof is None:
            raise RuntimeError("this profile was already summarized (its events are released once read)")
        prof, self._prof = self._prof, None
        result = summarize_events(prof.events(), device_type=self._device_type, active_steps=self._active)
        if self._trace_path is not None:
            saved, note = export_trace(prof, self._trace_path, self._trace_max_bytes)
            result.trace_path = saved
            if note:
                result.notes.append(note)
        return result


def record_profile(
    step_fn: Callable[[], Any],
    model: torch.nn.Module,
    *,
    device: torch.device,
    warmup: int = 2,
    active: int = 3,
    trace_path: str | None = None,
    trace_max_bytes: int = DEFAULT_TRACE_MAX_BYTES,
    with_module_ranges: bool = True,
) -> RecordedProfile:
    """Run `warmup + active` real steps under torch.profiler; the active ones are summarised by the result's
    `summarize` (see RecordedProfile for why that is a separate step).

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
    finished: list = []

    def on_trace_ready(prof) -> None:
        # The schedule runs one cycle (repeat=1), so nothing clears these events before summarize reads them.
        finished.append(prof)

    with warnings.catch_warnings():
        # "Profiler clears events at the end of each cycle": expected, the events are read before any next cycle.
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
    if not finished:
        raise RuntimeError("the profiler delivered no trace (its schedule never reached the end of the active steps)")
    return RecordedProfile(finished[0], device_type=device.type, active=active, trace_path=trace_path,
                           trace_max_bytes=trace_max_bytes)


def profile_workload(step_fn: Callable[[], Any], model: torch.nn.Module, **options: Any) -> ProfileResult:
    """record_profile and its summary in one call (for callers with one profile, nothing to overlap)."""
    return record_profile(step_fn, model, **options).summarize()


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
