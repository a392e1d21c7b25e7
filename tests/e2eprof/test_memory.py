"""Memory as a result: per-phase peaks in a worker, the summary's memory columns, and --find-max-batch on CPU.

On CPU the device columns are NaN and host RSS is real. Running out of memory is provoked through the worker's test
hook E2EPROF_TEST_MAX_TOKENS (e2eprof/trackers/memory.py), per arm here, so the search must find each arm's own limit.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch

from e2eprof.trackers.memory import TEST_LIMIT_ENV, MemoryTracker, check_test_limit, hook_token_limit

TIMEOUT_S = 600


def e2eprof(args: list[str], cwd, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("E2EPROF_DEBUG", TEST_LIMIT_ENV)} | env
    return subprocess.run([sys.executable, "-m", "e2eprof", *args], cwd=cwd, env=environ, capture_output=True,
                          text=True, timeout=TIMEOUT_S)


def test_host_peak_is_per_phase():
    tracker = MemoryTracker(torch.device("cpu"))
    size = 200 * 2**20
    with tracker.phase("train", "timing"):
        block = bytearray(size)  # zero-filled: every page is touched, so it is resident
        del block
    with tracker.phase("train", "cold"):
        pass
    timing, cold = tracker.peaks[("train", "timing")], tracker.peaks[("train", "cold")]
    assert math.isnan(timing["peak_alloc_mb"]) and math.isnan(timing["peak_reserved_mb"])  # no device on CPU
    assert timing["host_peak_rss_mb"] > 0
    if timing["host_rss_scope"] == "phase":  # Linux: the high-water mark is reset per phase
        assert timing["host_peak_rss_mb"] - cold["host_peak_rss_mb"] > 0.9 * size / 2**20


def test_repeated_phase_keeps_the_largest_peak():
    tracker = MemoryTracker(torch.device("cpu"))
    with tracker.phase("infer", "timing"):
        block = bytearray(100 * 2**20)
        del block
    first = tracker.peaks[("infer", "timing")]["host_peak_rss_mb"]
    with tracker.phase("infer", "timing"):
        pass
    assert tracker.peaks[("infer", "timing")]["host_peak_rss_mb"] >= first


def test_test_hook_forms(monkeypatch):
    monkeypatch.delenv(TEST_LIMIT_ENV, raising=False)
    assert hook_token_limit("baseline") is None
    check_test_limit("baseline", 10**6, 10**6)  # no limit set: nothing is refused
    monkeypatch.setenv(TEST_LIMIT_ENV, "64")
    assert hook_token_limit("patched") == 64
    check_test_limit("patched", 4, 16)
    with pytest.raises(MemoryError, match="65 tokens"):
        check_test_limit("patched", 5, 13)
    monkeypatch.setenv(TEST_LIMIT_ENV, "baseline:32,patched:128")
    assert (hook_token_limit("baseline"), hook_token_limit("patched"), hook_token_limit("sdpa")) == (32, 128, None)


def test_summary_and_memory_table_from_a_real_run(tmp_path):
    out = tmp_path / "report"
    result = e2eprof(["compare", "--model", "gpt2-tiny", "--patch", "fastsoftmax", "--device", "cpu", "--workload", "infer",
                      "--batch", "1", "--seq", "8", "--steps", "2", "--block-steps", "1", "--reference", "none",
                      "--no-profile", "--out", str(out)], tmp_path)
    assert result.returncode in (0, 1, 3), result.stderr
    summary = pd.read_parquet(out / "summary.parquet")
    assert {"peak_alloc_mb", "peak_reserved_mb", "host_peak_rss_mb"} <= set(summary.columns)
    assert set(summary.arm) == {"baseline", "patched"}
    assert (summary.host_peak_rss_mb > 0).all()
    assert summary.peak_alloc_mb.isna().all() and summary.peak_reserved_mb.isna().all()  # CPU: no device memory
    memory = pd.read_parquet(out / "memory.parquet")
    assert set(memory.phase) == {"cold", "correctness", "warmup", "timing"}
    assert set(memory.arm) == {"baseline", "patched"} and set(memory.point) == {"b1-s8-fp32"}
    assert (memory.host_peak_rss_mb > 0).all()
    timing = memory[memory.phase == "timing"].set_index("arm").host_peak_rss_mb
    assert dict(summary.set_index("arm").host_peak_rss_mb) == dict(timing)  # the summary shows the timed phase
    assert "peak memory:" in result.stdout


def test_find_max_batch_finds_each_arms_limit(tmp_path):
    out = tmp_path / "maxbatch"
    # seq 16: baseline fits 100 // 16 = 6 sequences, patched 200 // 16 = 12, under a cap of 64.
    result = e2eprof(["compare", "--model", "gpt2-tiny", "--patch", "fastsoftmax", "--device", "cpu",
                      "--workload", "train,infer", "--seq", "16", "--reference", "none", "--find-max-batch",
                      "--max-batch", "64", "--out", str(out)], tmp_path, E2EPROF_TEST_MAX_TOKENS="baseline:100,patched:200")
    assert result.returncode == 0, result.stderr
    table = pd.read_parquet(out / "maxbatch.parquet")
    found = dict(zip(table.arm, table.max_batch))
    assert found == {"baseline": 6, "patched": 12}
    assert dict(zip(table.arm, table.smallest_failed)) == {"baseline": 7, "patched": 13}
    assert (table.seq == 16).all() and not table.capped.any()
    assert pd.read_parquet(out / "run.parquet").iloc[0].status == "complete"
    assert "patched fits batch 12, baseline 6" in result.stdout


def _worker(tmp_path, device: str = "cpu", model: str = "gpt2-tiny", batch: int = 1, seq: int = 16):
    from e2eprof.harness.protocol import ArmSpec, WorkerSetup
    from e2eprof.harness.worker import ArmWorker

    worker = ArmWorker(WorkerSetup(arm=ArmSpec("baseline", "sdpa", False), model=model, patch_spec="fastsoftmax",
                                   device=device, precision="fp32" if device == "cpu" else "bf16", seed=0,
                                   batch=batch, seq=seq, new_tokens=2, scratch_dir=str(tmp_path)))
    worker.build()
    return worker


def test_a_finished_workload_leaves_nothing_to_the_next(tmp_path):
    """Memory reported for infer must not carry train's optimizer state and gradients (the H200 default run's infer
    arms reported what train had left in their processes)."""
    import gc
    import weakref

    worker = _worker(tmp_path)
    worker.dispatch("cold", {"workload": "train"})
    worker.dispatch("block", {"workload": "train", "block": 0, "steps": 2})
    optimizer_state = [weakref.ref(t) for state in worker.workloads["train"].optimizer.state.values()
                       for t in state.values() if isinstance(t, torch.Tensor)]
    assert optimizer_state and any(p.grad is not None for p in worker.model.parameters())
    assert worker.dispatch("end_workload", {"workload": "train"}) == {}
    gc.collect()
    assert "train" not in worker.workloads
    assert all(p.grad is None for p in worker.model.parameters())
    assert all(ref() is None for ref in optimizer_state), "the optimizer's state is still alive"
    worker.dispatch("cold", {"workload": "infer"})  # the next workload starts from the model and batches only
    rows = {(r["workload"], r["phase"]): r for r in worker.memory_peaks()}
    assert {"start_alloc_mb", "start_reserved_mb"} <= set(rows[("infer", "cold")])


def test_memory_rows_say_what_each_phase_began_with():
    tracker = MemoryTracker(torch.device("cpu"))
    with tracker.phase("train", "timing"):
        pass
    row = tracker.rows()[0]
    assert math.isnan(row["start_alloc_mb"]) and math.isnan(row["start_reserved_mb"])  # no device allocator on CPU
