"""Worker processes started before the run's checks: they become ordinary arm workers, spares stop at once, and a
run starts them only where each has a core of its own."""

from __future__ import annotations

import os
import time

import pytest

from e2eprof import runner
from e2eprof.config import CompareConfig
from e2eprof.harness import isolation, prestart
from e2eprof.harness.arm_plan import planned_arms, with_replicas
from e2eprof.harness.arm_process import ArmFailed, ArmProcess
from e2eprof.harness.prestart import Prestarted
from e2eprof.harness.protocol import ArmSpec, Build, Warmup, WorkerSetup


def _setup(tmp_path, placement=isolation.Placement()) -> WorkerSetup:
    return WorkerSetup(arm=ArmSpec("baseline", "sdpa", False), model="gpt2-tiny", patch_spec="fastsoftmax",
                       device="cpu", precision="fp32", seed=0, batch=1, seq=8, new_tokens=2,
                       scratch_dir=str(tmp_path), placement=placement)


def test_a_prestarted_process_becomes_an_arm_worker_with_its_placement(tmp_path):
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    placement = isolation.Placement(cores=(cores[-1],) if cores else None, threads=1, passive=True)
    pool = Prestarted(2, ("threads", "passive"), "gpt2")
    try:
        process = ArmProcess(_setup(tmp_path, placement), pool.take())
        try:
            build = process.call(Build())
            process.call(Warmup("infer", window=2, tolerance=0.5, max_steps=4, max_seconds=10))
        finally:
            process.close()
        assert build["model"]["vocab_size"] == 512 and build["pid"] != os.getpid()
        seen = build["placement"]
        assert seen["threads"] == 1  # set from its setup, after it had imported torch
        if cores:
            assert seen["cores"] == [cores[-1]]
        assert seen["omp_wait_policy"] == (os.environ.get("OMP_WAIT_POLICY") or "PASSIVE")  # set before torch loaded
        assert pool.take() is not None and pool.take() is None  # two were started, each handed out once
    finally:
        pool.close()


def test_spare_processes_stop_at_once_even_while_importing():
    pool = Prestarted(2, (), None)
    processes = [p for p, _ in pool._idle]
    started = time.perf_counter()
    pool.close()  # right away: both are still importing torch
    assert time.perf_counter() - started < 5
    assert not any(p.is_alive() for p in processes)
    assert pool.take() is None


def test_a_prestarted_process_that_died_is_reported_as_a_crash(tmp_path):
    pool = Prestarted(1, (), None)
    process, conn = pool.take()
    process.kill()
    process.join(timeout=10)
    arm = ArmProcess(_setup(tmp_path), (process, conn))
    with pytest.raises(ArmFailed, match="crashed|exited"):
        arm.call(Build())
    arm.close()


def test_a_run_prestarts_its_first_points_processes_only_where_each_has_a_core(monkeypatch):
    made = []
    monkeypatch.setattr(prestart, "Prestarted",
                        lambda count, parts, model_type: made.append((count, parts, model_type)) or made)
    config = CompareConfig(model="gpt2", patch="fastsoftmax", device="cpu", replicas=2,
                           reference_arms=("sdpa", "compile"))
    # baseline, patched, sdpa, compile and one more process each for baseline and patched
    arms = len(with_replicas(config, planned_arms(config, attn="eager")))
    assert arms == 6
    monkeypatch.setattr(isolation, "available_cores", lambda: tuple(range(16)))
    assert prestart.for_config(config) is made and made == [(6, config.isolate, "gpt2")]
    monkeypatch.setattr(isolation, "available_cores", lambda: (0, 1))  # the 2-core CI machine
    assert prestart.for_config(config) is None
    monkeypatch.setattr(isolation, "available_cores", lambda: tuple(range(16)))
    assert prestart.for_config(CompareConfig(model="no-such-model", patch="fastsoftmax", device="cpu")) is None
    assert len(made) == 1


def test_a_whole_run_with_prestarted_workers_completes_and_leaves_no_process_behind(tmp_path, monkeypatch):
    """The GPU-host path on this CPU: as if each process had a core, a run takes its workers from the early pool;
    fastgelu keeps SDPA, so the pool's stock-attention guess is one too many and that spare is stopped."""
    import multiprocessing as mp

    import pandas as pd

    monkeypatch.setattr(isolation, "available_cores", lambda: tuple(range(16)))
    started = []
    real = prestart.Prestarted

    def counting(count, parts, model_type):
        pool = real(count, parts, model_type)
        started.append((count, [p.pid for p, _ in pool._idle]))
        return pool

    monkeypatch.setattr(prestart, "Prestarted", counting)
    config = CompareConfig(model="gpt2-tiny", patch="fastgelu", device="cpu", workloads=("infer",),
                           out=tmp_path / "run", steps=4, block_steps=2, budget_seconds=0, profile=False)
    built = {}
    report = runner.compare(config, lambda kind, **kw: built.update(kw["builds"]) if kind == "built" else None)
    assert report.overall in ("PASS", "FAIL", "INCONCLUSIVE")
    assert pd.read_parquet(tmp_path / "run" / "run.parquet").iloc[0]["status"] == "complete"
    (count, pids), = started
    assert count == 3  # baseline, patched and the guessed stock-attention arm
    assert set(built) == {"baseline", "patched"}
    assert {b["pid"] for b in built.values()} < set(pids)  # the arms ran in prestarted processes
    assert not mp.active_children(), "a prestarted process outlived the run"


def test_a_point_that_resume_skips_stops_the_prestarted_processes(tmp_path):
    """--resume with the first point already finished: its prestarted processes are stopped there, not left idle
    (holding their imports' memory) through the later points."""
    from e2eprof.harness.state import RunState
    from e2eprof.resume import unit_key

    class Pool:
        closed = 0

        def close(self):
            Pool.closed += 1

        def take(self):
            raise AssertionError("a finished point starts no worker")

    config = CompareConfig(model="gpt2-tiny", patch="fastsoftmax", device="cpu", workloads=("infer",))
    point = config.points[0]
    state = RunState(tmp_path, {}, sampler=None)
    state.units = {unit_key(point.id, "infer"): {}}
    runner._run_point(config.at(point), point, planned_arms(config, "eager"), state, {}, tmp_path, lambda *a, **k: None,
                      Pool())
    assert Pool.closed == 1


def test_the_command_starts_its_workers_before_the_parent_imports_torch_pandas_or_transformers():
    """The workers' head start is the parent's imports: on a GPU host the workers' own imports decide when the first
    step can run, and they began only once the parent had imported torch (reports/2026-12-07-h200-run-time/)."""
    import subprocess
    import sys

    script = (
        "import os, sys\n"
        "from e2eprof.harness import isolation, prestart\n"
        "isolation.available_cores = lambda: tuple(range(16))\n"
        "def seen(count, parts, model_type):\n"
        "    heavy = sorted(m for m in ('torch', 'pandas', 'transformers') if m in sys.modules)\n"
        "    print('started', count, model_type, 'after', heavy or 'nothing heavy', flush=True)\n"
        "    os._exit(0)\n"
        "prestart.Prestarted = seen\n"
        "from e2eprof.cli import main\n"
        "sys.argv = ['e2eprof', 'compare', '--model', 'gpt2-tiny', '--patch', 'fastsoftmax', '--device', 'cpu',\n"
        "            '--workload', 'infer', '--out', os.environ['RUN_DIR']]\n"
        "main()\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "RUN_DIR": "/nonexistent/e2eprof-test-run"})
    assert "started 3 gpt2 after nothing heavy" in out.stdout, out.stdout + out.stderr


def test_the_command_hands_its_early_processes_to_the_run(tmp_path, monkeypatch):
    """The processes the command line starts are the ones the run's arms use: not a second set started by the run."""
    import multiprocessing as mp

    from e2eprof import cli

    monkeypatch.setattr(isolation, "available_cores", lambda: tuple(range(16)))
    pools = []
    real = prestart.Prestarted

    def counting(count, parts, model_type):
        pools.append(real(count, parts, model_type))
        pools[-1].pids = [p.pid for p, _ in pools[-1]._idle]
        return pools[-1]

    monkeypatch.setattr(prestart, "Prestarted", counting)
    built = []
    real_broadcast = runner.broadcast

    def seeing_builds(processes, state, command):
        answers = real_broadcast(processes, state, command)
        if isinstance(command, Build):
            built.extend(answer["pid"] for answer in answers.values())
        return answers

    monkeypatch.setattr(runner, "broadcast", seeing_builds)
    code = cli.main(["compare", "--model", "gpt2-tiny", "--patch", "fastgelu", "--device", "cpu", "--workload",
                     "infer", "--steps", "4", "--block-steps", "2", "--budget", "0", "--no-profile",
                     "--out", str(tmp_path / "run")])
    assert code in (0, 1, 3)
    assert len(pools) == 1, "the run started a second set of processes"
    assert len(built) == 2 and set(built) < set(pools[0].pids)
    assert not mp.active_children(), "a prestarted process outlived the run"
    # run.parquet dates each worker's start: inside the command's start-up, before its checks were done.
    import json

    import pandas as pd

    startup = json.loads(pd.read_parquet(tmp_path / "run" / "run.parquet").iloc[0]["startup_json"])
    phases = pd.read_parquet(tmp_path / "run" / "phases.parquet").set_index("phase")
    checks = phases.loc["start-up and checks"]
    assert set(startup) == {"baseline", "patched"}
    for ages in startup.values():
        # /proc dates a process to the clock tick (10 ms): a worker may read as started just before the command did
        assert checks.start_unix_ns - 2e7 <= ages["started_unix_ns"] <= checks.end_unix_ns
        assert 0 < ages["imported"] <= ages["setup"] <= ages["build"] and ages["build_s"] > 0
