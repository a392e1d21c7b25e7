"""The worker process: one arm of a comparison, isolated so a patch cannot leak into another arm.

The parent sends the commands of e2eprof.harness.protocol over a pipe, each run by the method of its name; the
worker answers ("ok", result) or ("error", {...}) and never raises across the pipe. A crash (segfault, CUDA
fault) shows up in the parent as a closed pipe, and the parent keeps every other arm's data.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import signal
import threading
import time
import traceback

import torch

from e2eprof.trackers import jit_events
from e2eprof.config import DECODING_WORKLOADS
from e2eprof.harness import scratch
from e2eprof.harness.protocol import WorkerSetup
from e2eprof.harness.isolation import apply_in_worker, freeze_survivors, gc_off_the_clock, host_blocks_kept, whole_host
from e2eprof.trackers.memory import MemoryTracker, check_test_limit, release
from e2eprof.candidates import apply_any, load_candidate
from e2eprof.patching import AppliedPatch
from e2eprof.analysis.stats import warm_windows_agree
from e2eprof.workloads import trained_like
from e2eprof.workloads.batches import digest, synthetic_token_batches
from e2eprof.workloads.loops import IGNORE_INDEX, make_workload
from e2eprof.workloads.models import build_model, describe, resolve_model

N_BATCHES = 4  # distinct seeded batches cycled through, so no step reuses the previous step's input buffer
# The phase of memory.parquet each command's peaks belong to (timed blocks run as many commands: one phase).
MEMORY_PHASES = {"cold": "cold", "capture": "correctness", "reference": "correctness", "trained_like": "correctness",
                 "warmup": "warmup",
                 "block": "timing", "profile": "profile", "probe": "probe"}


# Untimed checks whose memory (fp64 copies, verified calls' outputs, profiler buffers) must not stay in the allocator's
# cache: the next phase's reserved peak would report it as its own (a patched arm's timed inference showed 23.8 GB
# reserved against the baseline's 11.7 GB for the same step). Warm-up grows the cache back before anything is timed.
RELEASE_AFTER = {"capture", "reference", "trained_like", "profile"}


def _synchronize(device: torch.device) -> None:
    # Device-wide, not stream-level: work a kernel hides on another stream still counts.
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class ArmWorker:
    """Holds the model, batches and workloads of one arm inside its own process."""

    def __init__(self, setup: WorkerSetup):
        self.setup = setup
        self.device = torch.device(setup.device)
        self.applied: AppliedPatch | None = None
        self.workloads: dict = {}
        self.step_counter: dict[str, int] = {}
        self.memory = MemoryTracker(self.device)
        self.jit: dict[tuple[str, str], dict[str, float]] = {}  # (workload, phase) -> jit_events counts
        self._recorded_profiles: dict[str, tuple] = {}  # workload -> (RecordedProfile, replaced calls), until summarized
        jit_events.install()
        self.rank = 0  # this process's rank in its arm's worker group (e2eprof.distributed); 0 when it is alone

    def dispatch(self, command: str, kwargs: dict):
        """Run one command, with its memory peaks and just-in-time work recorded when it is a measured phase."""
        phase = MEMORY_PHASES.get(command)
        if phase is None:
            return getattr(self, command)(**kwargs)
        key = (kwargs.get("workload", "*"), phase)
        before = jit_events.snapshot()
        try:
            with self.memory.phase(*key):
                result = getattr(self, command)(**kwargs)
        finally:
            done = jit_events.delta(before, jit_events.snapshot())
            seen = self.jit.setdefault(key, dict.fromkeys(jit_events.COUNTS, 0.0))
            for name, count in done.items():
                seen[name] += count
        if command in RELEASE_AFTER:
            release(self.device)
        return result

    def release_after_oom(self, workload: str | None) -> None:
        """Drop what the failed workload allocated (its optimizer state, gradients) and return cached memory (every
        workload's when None)."""
        for name in [workload] if workload else list(self.workloads):
            self.workloads.pop(name, None)
            self._recorded_profiles.pop(name, None)
        if getattr(self, "model", None) is not None:
            self.model.zero_grad(set_to_none=True)
        release(self.device)

    # ---- commands -------------------------------------------------------------------------------------
    def end_workload(self, workload: str) -> dict:
        """This workload is done in this process: drop its state (a training loop's optimizer state and the model's
        gradients) and the allocator's cache, so the next workload's memory is its own, not a carry-over. The same
        clean-up as after running out of memory."""
        self.release_after_oom(workload)
        return {}

    def release_cached_memory(self) -> dict:
        """Give the allocator's cached blocks back to the device (untimed: the next steps re-grow the cache), so
        an arm retried alone after running out of memory can use them."""
        release(self.device)
        return {}

    def build(self) -> dict:
        setup = self.setup
        started = time.perf_counter()
        # Where this process's start-up went, in its own clock: imports done, setup received, build begun.
        ages = {"imported": _IMPORTED_AT, "setup": _SETUP_AT, "build": process_age()}
        build_began_unix_ns = time.time_ns()
        # Every arm loads it, so every arm can report its counters (a stock arm of several candidates: all of them).
        self.loaded = load_candidate(setup.patch_spec)
        # Whether the patch fits the model was checked in the parent before any process started
        # (runner.check_before_measuring), and apply_patch checks it again on the built model.
        # On a GPU the weights are drawn there (see build_model): seconds of CPU time per worker saved.
        model = build_model(resolve_model(setup.model), attn_implementation=setup.arm.attn_implementation,
                            seed=setup.seed, device=self.device)
        if setup.arm.apply_patch:
            self.applied = apply_any(self.loaded.patch, model)
        self.model = model.to(self.device)
        # What the loops call. torch.compile wraps the module and shares its parameters, so restoring pristine
        # weights into self.model reaches the compiled one too. Compilation itself happens in the cold step.
        self.step_model = torch.compile(self.model) if setup.arm.compile else self.model
        # Weights as built, restored before every correctness capture so all arms compare the same model
        # even after their (differently long) timed phases have trained it.
        self.pristine = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
        info = describe(self.model)
        self.batches = synthetic_token_batches(
            N_BATCHES, setup.batch, setup.seq, info["vocab_size"], seed=self._batch_seed(), pin=self.device.type == "cuda"
        )
        return {
            "arm": setup.arm.name,
            "replica": setup.arm.replica,
            "model": info,
            "sites": self.applied.sites if self.applied else [],
            "build_s": time.perf_counter() - started,
            "process_age_s": ages,
            "started_unix_ns": None if ages["build"] is None else build_began_unix_ns - int(ages["build"] * 1e9),
            "batch_digest": digest(self.batches),
            "pid": os.getpid(),
            "placement": _placement_seen(),
        }

    def _batch_seed(self) -> int:
        # The same batches in every arm; a data-parallel rank worker gives each rank its own shard's seed instead.
        return self.setup.seed + 1

    def _agree(self, decision: bool) -> bool:
        # A data-parallel worker group takes rank 0's decision on every rank: ranks that ran different numbers of
        # steps would wait for each other's collectives forever.
        return decision

    def _restore_pristine(self) -> None:
        self.model.load_state_dict(self.pristine)

    def _workload(self, name: str):
        if name not in self.workloads:
            check_test_limit(self.setup.arm.name, self.setup.batch, self.setup.seq)
            self.workloads[name] = make_workload(name, self.step_model, self.device, self.setup.precision,
                                                 **self._options(name))
            self.step_counter[name] = 0
        return self.workloads[name]

    def _options(self, workload: str) -> dict:
        return {"new_tokens": self.setup.new_tokens} if workload in DECODING_WORKLOADS else {}

    def _timed_step(self, workload_name: str, phase: str, block: int) -> dict:
        workload = self._workload(workload_name)
        index = self.step_counter[workload_name]
        batch = self.batches[index % len(self.batches)]
        cuda = self.device.type == "cuda"
        if cuda:
            start_event = torch.cuda.Event(enable_timing=True)
            end_event = torch.cuda.Event(enable_timing=True)
        _synchronize(self.device)
        threads_before = threading.active_count()
        start_unix_ns = time.time_ns()
        t0 = time.perf_counter_ns()
        if cuda:
            start_event.record()
        extra = workload.step(batch)
        if cuda:
            end_event.record()
        _synchronize(self.device)
        wall_ns = time.perf_counter_ns() - t0
        self.step_counter[workload_name] = index + 1
        return {
            "workload": workload_name,
            "arm": self.setup.arm.name,
            "replica": self.setup.arm.replica,
            "block": block,
            "step": index,
            "rank": self.rank,
            "phase": phase,
            "wall_ns": wall_ns,
            "device_ms": start_event.elapsed_time(end_event) if cuda else math.nan,
            "start_unix_ns": start_unix_ns,
            "end_unix_ns": start_unix_ns + wall_ns,
            "ttft_ms": extra.get("ttft_ms", math.nan),
            "tpot_ms": extra.get("tpot_ms", math.nan),
            "threads_delta": threading.active_count() - threads_before,
        }

    def cold(self, workload: str) -> list[dict]:
        """The first step of this workload in this process: JIT, autotune and handle creation included."""
        return [self._timed_step(workload, "cold", -1)]

    def warmup(self, workload: str, window: int, tolerance: float, max_steps: int, max_seconds: float) -> list[dict]:
        """Run until two consecutive windows' medians agree (within `tolerance`, or within the steps' own noise:
        stats.warm_windows_agree), or `max_steps` / `max_seconds` run out."""
        rows: list[dict] = []
        previous = None
        deadline = time.perf_counter() + max_seconds
        while self._agree(len(rows) + window <= max(max_steps, 2 * window)
                          and (len(rows) < 2 * window or time.perf_counter() < deadline)):
            with gc_off_the_clock(self.setup.placement):  # as the timed blocks will run
                window_rows = [self._timed_step(workload, "warmup", -1) for _ in range(window)]
            rows.extend(window_rows)
            current = [r["wall_ns"] for r in window_rows]
            if self._agree(previous is not None and warm_windows_agree(previous, current, tolerance)):
                break
            previous = current
        freeze_survivors(self.setup.placement)
        return rows

    def block(self, workload: str, block: int, steps: int) -> list[dict]:
        with gc_off_the_clock(self.setup.placement):
            return [self._timed_step(workload, "warm", block) for _ in range(steps)]

    def capture(self, workload: str, path: str, verify: bool, extended: bool = True) -> dict:
        """Correctness outputs on pristine weights, saved as safetensors; op-level checks when verifying (extended:
        with the once-per-signature unseen-shape and stress checks, see AppliedPatch.set_verify)."""
        self._restore_pristine()
        instance = self._workload(workload)
        if self.applied is not None:
            self.applied.set_verify(verify, extended)
        try:
            outputs = instance.capture(self.batches[0])
        finally:
            if self.applied is not None:
                self.applied.set_verify(False)
        path = _save_outputs(outputs, path)
        checks = []
        if self.applied is not None and verify:
            checks = [vars(c) | {"problems": list(c.problems)} for c in self.applied.checks()]
            for recorder in self.applied.recorders:
                recorder.checks.clear()
        return {"path": path, "keys": sorted(outputs), "op_checks": checks}

    def trained_like(self, workload: str) -> dict:
        """The gate's extra capture on trained-like weights (workloads.trained_like): outlier channels, offset rows,
        attention logits in the tens and a padded batch, every call of the patch checked as in `capture` (without
        the unseen-shape and stress checks, which the gate's capture ran on these signatures). Forward, and
        backward for train; the pristine weights and the gradients are back afterwards."""
        if self.applied is None:
            raise RuntimeError("the trained-like capture checks a patched arm's calls")
        started = time.perf_counter()
        instance = self._workload(workload)
        ids, mask = trained_like.padded(self.batches[0], trained_like.pad_token_id(self.model.config))
        ids, mask = ids.to(self.device), mask.to(self.device)
        self._restore_pristine()
        backward = workload == "train"
        saved = {p: p.grad for p in self.model.parameters()}
        try:
            try:
                moved = trained_like.transform(self.model, ids, mask, seed=self.setup.seed)
            except trained_like.NotTransformable as exc:
                return {"op_checks": [], "skipped": str(exc)}
            inputs = instance._model_inputs(ids, labels=backward) | {"attention_mask": mask}
            if backward:  # the loss skips the pad positions, as a real padded batch's labels do
                inputs["labels"] = inputs["labels"].masked_fill(mask == 0, IGNORE_INDEX)
            for p in saved:
                p.grad = None
            self.applied.set_verify(True, extended=False)
            with trained_like.eval_mode(self.model), torch.set_grad_enabled(backward):
                with instance._autocast():
                    out = self.model(**inputs)
                if backward:
                    out.loss.backward()
        finally:
            self.applied.set_verify(False)
            for p, grad in saved.items():
                p.grad = grad
            self._restore_pristine()
        checks = [vars(c) | {"problems": list(c.problems)} for c in self.applied.checks()]
        for recorder in self.applied.recorders:
            recorder.checks.clear()
        return {"op_checks": checks, "transform": moved.describe(), "seconds": time.perf_counter() - started}

    def reference(self, workload: str, path: str, host_fallback: bool = True) -> dict:
        """fp64 outputs of this arm's (stock) model on the same batch: the trusted reference.

        On the arm's device when it fits there beside the other arms' processes, else on the host from a model
        rebuilt there, on every core (isolation.whole_host): the reference is untimed, and without it the workload
        would lose its correctness gate and, with the baseline out of memory, its verdict (llama-1b training beside
        five processes on the H200).
        "device" in the answer says where it ran. host_fallback=False: out of memory on the device answers
        {"out_of_memory": True} instead, so the parent can ask again once the other processes have made room.
        """
        if self.applied is not None:
            raise RuntimeError("the fp64 reference must come from an unpatched arm")
        check_test_limit(self.setup.arm.name, self.setup.batch, self.setup.seq)
        ran_out = False
        try:
            # The copy is made inside the argument, so _fp64_outputs holds its only reference and frees it before
            # emptying the cache: a name bound here would keep the fp64 model's memory cached after the reference.
            outputs = self._fp64_outputs(workload, self._device_fp64_model(), self.device)
        except torch.cuda.OutOfMemoryError:
            ran_out = True
        if ran_out:
            # Outside the except block, so the traceback no longer pins the failed attempt's tensors.
            release(self.device)
            if not host_fallback:
                return {"out_of_memory": True}
            with whole_host():
                outputs = self._fp64_outputs(workload, self._fresh_fp64_model(), torch.device("cpu"))
        path = _save_outputs(outputs, path)
        return {"path": path, "keys": sorted(outputs), "device": "cpu" if ran_out else self.device.type}

    def _fp64_outputs(self, workload: str, model64: torch.nn.Module, device: torch.device) -> dict:
        instance = make_workload(workload, model64, device, "fp64", **self._options(workload))
        outputs = instance.capture(self.batches[0])
        del instance, model64
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return outputs

    def _device_fp64_model(self) -> torch.nn.Module:
        """The stock model in fp64 on this arm's device: a copy of this arm's model with the pristine weights."""
        model64 = copy.deepcopy(self.model)
        model64.load_state_dict(self.pristine)
        return model64.double()

    def _fresh_fp64_model(self) -> torch.nn.Module:
        """The stock model in fp64 on the host, built from the source and the pristine weights: not copied from
        this arm's model, whose device may have just run out (or which FSDP has resharded in place)."""
        model = build_model(resolve_model(self.setup.model), attn_implementation=self.setup.arm.attn_implementation,
                            seed=self.setup.seed)
        model.load_state_dict(self.pristine)
        return model.double()

    def profile(self, workload: str, warmup: int, active: int, trace_path: str | None = None) -> dict:
        """torch.profiler over a few real steps, after timing; `summarize_profile` turns them into the per-op table,
        replaced-region time and completeness (a separate command, so the parent can overlap every arm's summary).

        The replaced function's calls are wrapped in an `e2eprof.replaced::<patch>` range in every arm (stock
        arms through a pass-through recorder), so its share of the step is measured the same way everywhere.
        """
        from e2eprof.trackers.profiling import record_profile

        instance = self._workload(workload)
        passthrough = None
        compiled = self.setup.arm.compile
        if self.applied is not None:
            self.applied.set_mark_ranges(True)
        elif not compiled and getattr(self.loaded.patch, "disjoint", lambda: True)():
            # Profiler ranges inside a compiled graph would break it: profile what really runs. With the model, so
            # instances of a class target are counted and ranged too. (Candidates on one site: no single region.)
            passthrough = apply_any(self.loaded.patch, self.model, passthrough=True)
            passthrough.set_mark_ranges(True)
        counter = iter(range(10**9))

        def one_step():
            instance.step(self.batches[next(counter) % len(self.batches)])

        # A CUDA graph replay runs no Python, so no module range: the decode workload profiles the same kernels
        # launched eagerly.
        eager = getattr(instance, "eager", contextlib.nullcontext)
        try:
            with eager():
                recorded = record_profile(one_step, self.model, device=self.device, warmup=warmup, active=active,
                                          trace_path=trace_path, with_module_ranges=not compiled)
        finally:
            if self.applied is not None:
                self.applied.set_mark_ranges(False)
            if passthrough is not None:
                passthrough.revert()
        self._recorded_profiles[workload] = (recorded, passthrough.calls if passthrough is not None else None)
        return {"recorded": True}

    def summarize_profile(self, workload: str) -> dict:
        """The profile `profile` recorded for `workload`: its tables, and the problems that make it unusable."""
        from e2eprof.trackers.profiling import check_complete

        recorded, replaced_calls = self._recorded_profiles.pop(workload)
        result = recorded.summarize()
        compiled = self.setup.arm.compile
        # A compiled arm is profiled without module ranges (they would break its graphs): no attribution expected.
        problems = check_complete(result, device_type=self.device.type, expect_modules=not compiled)
        expected = self.loaded.patch.kernel_names if (self.applied is not None and self.device.type == "cuda") else ()
        launched = {k["kernel"] for k in result.kernels}
        # Any one of the patch's kernels proves it ran: a forward-only workload never launches the backward kernel.
        if expected and not any(name in kernel for name in expected for kernel in launched):
            problems.append(f"none of the patch's kernels ({', '.join(expected)}) appear in the trace")
        return {"result": result.to_dict(), "problems": problems, "replaced_calls": replaced_calls}

    def counters(self) -> dict:
        implementations = self.loaded.patch.implementations
        return {
            "arm": self.setup.arm.name,
            "wrapper_calls": self.applied.calls if self.applied else 0,
            "signatures": dict(self.applied.signatures()) if self.applied else {},
            # None (not {}) when the patch declares no counter: "no evidence" is not "zero calls".
            "implementations": dict(implementations()) if implementations else None,
        }

    def jit_counts(self) -> list[dict]:
        """Just-in-time work per (workload, phase) so far in this process (e2eprof.trackers.jit_events)."""
        return [{"workload": w, "phase": p, **counts, "arm": self.setup.arm.name, "replica": self.setup.arm.replica,
                 "rank": self.rank} for (w, p), counts in self.jit.items()]

    def memory_peaks(self) -> list[dict]:
        """Peak device and host memory per (workload, phase) so far in this process."""
        return [row | {"arm": self.setup.arm.name, "rank": self.rank} for row in self.memory.rows()]

    def probe(self, batch: int, workloads: list[str]) -> dict:
        """Does one step of each workload run at this batch (at the setup's seq)? Out of memory is an answer here."""
        from e2eprof.workloads.batches import synthetic_token_batches as batches_of

        vocab = describe(self.model)["vocab_size"]
        failure = None
        try:
            check_test_limit(self.setup.arm.name, batch, self.setup.seq)
            host = batches_of(1, batch, self.setup.seq, vocab, seed=self.setup.seed + 1, pin=self.device.type == "cuda")[0]
            for name in workloads:
                instance = make_workload(name, self.step_model, self.device, self.setup.precision, **self._options(name))
                instance.step(host)
                _synchronize(self.device)
                del instance
        except (MemoryError, torch.cuda.OutOfMemoryError) as exc:
            failure = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        # After the except block: the exception's traceback no longer pins the failed step's tensors.
        self.release_after_oom(None)
        return {"batch": batch, "fits": failure is None, "detail": failure or "one step of each workload ran",
                "peak_alloc_mb": torch.cuda.max_memory_allocated(self.device) / 2**20 if self.device.type == "cuda" else math.nan}

    def revert(self) -> dict:
        if self.applied is not None:
            self.applied.revert()
        return {}


def process_age() -> float | None:
    """Seconds since this process started, from Linux's /proc (None elsewhere): a worker's start-up in its own
    clock, whoever started it (ArmProcess now, or harness/prestart.py before the parent's checks)."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
            return float(uptime.read().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


_IMPORTED_AT = process_age()  # this module and everything it imports (torch, transformers' base) loaded
# process_age() when worker_main got its setup: for a process started early, when it read the setup from its pipe,
# which is after its imports however early the parent sent it.
_SETUP_AT: float | None = None


def note_imports_done() -> None:
    """A process started early (harness/prestart.py) imports the model's modeling code too: its imports end here."""
    global _IMPORTED_AT
    _IMPORTED_AT = process_age()


def worker_main(conn, setup: WorkerSetup) -> None:
    """Entry point of the spawned process: answer commands until 'close' or the pipe breaks."""
    global _SETUP_AT
    _SETUP_AT = process_age()
    # Ctrl-C reaches the whole process group; the parent decides how to stop and saves what was measured,
    # so workers ignore SIGINT and leave when the parent closes the pipe or terminates them.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    apply_in_worker(setup.placement)
    worker = ArmWorker(setup)
    while True:
        try:
            command, kwargs = conn.recv()
        except (EOFError, OSError):
            return
        if command == "close":
            conn.send(("ok", {}))
            return
        out_of_memory = False
        try:
            result = worker.dispatch(command, kwargs)
            conn.send(("ok", result))
        except BaseException as exc:  # report, don't die: the parent decides what a failure means
            out_of_memory = isinstance(exc, (MemoryError, torch.cuda.OutOfMemoryError))
            conn.send(("error", {"type": type(exc).__name__, "message": str(exc).splitlines()[0] if str(exc) else "",
                                 "traceback": traceback.format_exc(limit=20)}))
        if out_of_memory:
            # Outside the except block, so the traceback no longer pins the failed step's tensors; the arm stays
            # usable for its other workloads.
            worker.release_after_oom(kwargs.get("workload"))


def _placement_seen() -> dict:
    """Where this process really runs (e2eprof.harness.isolation asked for it; the OS and torch say what took effect)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {"cores": cores, "threads": torch.get_num_threads(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "host_blocks_kept": host_blocks_kept()}


def _save_outputs(outputs: dict, path: str) -> str:
    """Write a capture meant for `path`; return where it went (scratch.write_path: in memory when it fits)."""
    from safetensors.torch import save_file

    tensors = {k: v.contiguous() for k, v in outputs.items()}
    written = scratch.write_path(path, sum(t.numel() * t.element_size() for t in tensors.values()))
    save_file(tensors, written)
    return written
