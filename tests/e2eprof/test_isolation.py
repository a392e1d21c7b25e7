"""Worker isolation: disjoint cores per worker where the machine has them, threads sized to them, idle OpenMP
threads asleep, gc kept out of timed steps; and what each worker process really got."""

from __future__ import annotations

import gc
import os
import sys

import pytest
import torch

from e2eprof.harness.arm_process import ArmProcess
from e2eprof.config import CompareConfig
from e2eprof.errors import UsageError
from e2eprof.harness import isolation
from e2eprof.harness.isolation import PARTS, Placement, environment, gc_off_the_clock, parse, plan
from e2eprof.harness.protocol import ArmSpec, Build, Warmup, WorkerSetup


def test_an_h200_hosts_cores_are_dealt_out_disjoint_and_the_parent_keeps_one():
    assert parse(None) == ("threads", "passive", "gc")  # the default: no pinning (README's trust section says why)
    placements = plan(6, PARTS, cores=tuple(range(16)))
    cores = [p.cores for p in placements]
    assert all(len(c) == 2 for c in cores) and 0 not in {x for c in cores for x in c}
    assert len({x for c in cores for x in c}) == 12, "shares overlap"
    assert all(p.threads == 2 and p.passive and p.gc_off_the_clock for p in placements)
    assert placements[0].environment() == {k: v for k, v in {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"}.items()
                                           if k not in os.environ}


def test_a_small_machine_shares_its_cores_and_none_turns_everything_off():
    assert all(p.cores is None and p.threads is None for p in plan(3, PARTS, cores=(0, 1)))
    # one spare core per worker is not pinned: 8 processes on 16 cores share them, two threads' worth each
    assert all(p.cores is None and p.threads == 1 for p in plan(8, PARTS, cores=tuple(range(16))))
    assert plan(2, parse("none"), cores=tuple(range(16))) == [Placement(), Placement()]
    threads_only = plan(4, parse("threads"), cores=tuple(range(16)))
    assert all(p.cores is None and p.threads == 3 and not p.passive for p in threads_only)


def test_isolate_option_values():
    assert parse("all") == PARTS and parse("none") == ()
    assert parse("gc,cores") == ("cores", "gc")
    with pytest.raises(ValueError, match="unknown part 'corse'"):
        parse("corse")
    with pytest.raises(UsageError, match="--isolate"):
        CompareConfig(model="gpt2-tiny", patch="fastsoftmax", device="cpu", isolate="fast")


def test_a_users_own_omp_setting_wins(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    assert "OMP_NUM_THREADS" not in Placement(threads=2).environment()
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    with environment(Placement(threads=2, passive=True).environment()):
        assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE" and os.environ["OMP_NUM_THREADS"] == "7"
    assert "OMP_WAIT_POLICY" not in os.environ


def test_no_collection_inside_a_window_of_steps():
    collections = []
    gc.callbacks.append(lambda phase, info: collections.append(phase))
    try:
        with gc_off_the_clock(Placement(gc_off_the_clock=True)):
            collections.clear()
            for _ in range(20000):  # cycles that would trigger generation-0 collections
                a = []
                a.append(a)
            assert not gc.isenabled() and collections == []
        assert gc.isenabled()
    finally:
        gc.callbacks.pop()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux affinity and two cores")
def test_a_worker_runs_where_it_was_placed(tmp_path):
    core = sorted(os.sched_getaffinity(0))[-1]
    placement = Placement(cores=(core,), threads=1, passive=True, gc_off_the_clock=True)
    process = ArmProcess(WorkerSetup(arm=ArmSpec("baseline", "sdpa", False), model="gpt2-tiny", patch_spec="fastsoftmax",
                                     device="cpu", precision="fp32", seed=0, batch=1, seq=8, new_tokens=2,
                                     scratch_dir=str(tmp_path), placement=placement))
    try:
        seen = process.call(Build())["placement"]
        process.call(Warmup("infer", window=2, tolerance=0.5, max_steps=4, max_seconds=10))
    finally:
        process.close()
    assert seen["cores"] == [core] and seen["threads"] == 1
    assert seen["omp_wait_policy"] == (os.environ.get("OMP_WAIT_POLICY") or "PASSIVE")


def test_malloc_is_a_cpu_default_and_all_includes_it():
    assert parse(None, "cpu") == ("threads", "passive", "gc", "malloc")
    assert parse(None, "cuda:0") == parse(None) == ("threads", "passive", "gc")
    assert "malloc" in parse("all") and parse("malloc") == ("malloc",)
    assert all(p.keep_host_blocks for p in plan(3, parse(None, "cpu"), cores=(0, 1)))
    assert not any(p.keep_host_blocks for p in plan(3, parse(None, "cuda"), cores=(0, 1)))


_FAULTS = """
import resource, sys, torch
from e2eprof.harness import isolation
if sys.argv[1] == "keep":
    assert isolation.keep_host_blocks()
for _ in range(12):  # the first blocks are faulted in either way (kept: until the heap has room for the pattern)
    torch.ones(64 * 2**20 // 4)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    torch.ones(64 * 2**20 // 4)  # 64 MB, freed at once: glibc maps and unmaps a block this size every time
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or isolation._glibc() is None, reason="glibc's mallopt")
def test_kept_host_blocks_are_not_faulted_in_again():
    import subprocess

    def faults(mode):
        out = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, check=True)
        return int(out.stdout.split()[-1])

    default, kept = faults("default"), faults("keep")
    assert default > 10 * 64 * 2**20 // 4096 // 2, default  # most of ten 64 MB blocks' pages faulted in again
    assert kept < default / 20, (kept, default)
