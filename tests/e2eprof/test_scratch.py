"""The run's scratch folder: named after its owner, and the folders of killed runs removed by the next run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from e2eprof.harness import scratch


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid  # reaped: no process has this pid now (reuse within the test is vanishingly unlikely)


def test_only_this_hosts_folders_of_dead_processes_are_removed(tmp_path):
    host = scratch._host()
    dead = tmp_path / f"{scratch.PREFIX}{_dead_pid()}@{host}-abc123_x"
    live = tmp_path / f"{scratch.PREFIX}{os.getpid()}@{host}-def456"
    other_host = tmp_path / f"{scratch.PREFIX}{_dead_pid()}@{host}-elsewhere-ghi789"
    unnamed = tmp_path / f"{scratch.PREFIX}4__riut8"  # an older run's name: its owner cannot be told
    not_ours = tmp_path / "something-else"
    for folder in (dead, live, other_host, unnamed, not_ours):
        folder.mkdir()
        (folder / "capture.safetensors").write_bytes(b"x" * 10)
    assert scratch.remove_orphans(tmp_path) == [dead]
    assert not dead.exists()
    assert all(f.exists() for f in (live, other_host, unnamed, not_ours))


def test_create_names_the_owner_and_reports_what_it_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(scratch.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(scratch, "_memory_root_usable", lambda: False)
    left = tmp_path / f"{scratch.PREFIX}{_dead_pid()}@{scratch._host()}-zz9"
    left.mkdir()
    folder, removed = scratch.create()
    assert removed == [left] and folder.parent == tmp_path and folder.is_dir()
    assert scratch._owner(folder.name) == (os.getpid(), scratch._host())
    assert scratch.remove_orphans(tmp_path) == []  # its own folder is alive


def _twin_root(tmp_path, monkeypatch, room: bool = True):
    """MEMORY_ROOT moved to a folder of the test's, with or without room in memory."""
    memory = tmp_path / "shm"
    memory.mkdir()
    monkeypatch.setattr(scratch, "MEMORY_ROOT", memory)
    monkeypatch.setattr(scratch, "_room_in_memory", lambda folder, nbytes: room)
    return memory


def test_a_capture_goes_to_the_twin_in_memory_when_it_has_room_and_is_found_there(tmp_path, monkeypatch):
    memory = _twin_root(tmp_path, monkeypatch)
    monkeypatch.setattr(scratch, "_memory_root_usable", lambda: True)
    monkeypatch.setattr(scratch.tempfile, "tempdir", str(tmp_path / "disk"))
    (tmp_path / "disk").mkdir()
    folder, _ = scratch.create()
    assert (memory / folder.name).is_dir()
    meant = str(folder / "reference-train-fp64.safetensors")
    written = scratch.write_path(meant, 10)
    assert written == str(memory / folder.name / "reference-train-fp64.safetensors")
    with open(written, "wb") as f:
        f.write(b"x" * 10)
    assert scratch.located(meant) == written
    scratch.remove(folder)
    assert not folder.exists() and not (memory / folder.name).exists()


def test_without_room_the_capture_goes_to_disk_and_an_older_copy_in_memory_is_removed(tmp_path, monkeypatch):
    memory = _twin_root(tmp_path, monkeypatch, room=False)
    folder = tmp_path / f"{scratch.PREFIX}{os.getpid()}@{scratch._host()}-abc"
    folder.mkdir()
    (memory / folder.name).mkdir()
    stale = memory / folder.name / "capture-train-patched.safetensors"
    stale.write_bytes(b"old")
    meant = str(folder / "capture-train-patched.safetensors")
    assert scratch.write_path(meant, 10**9) == meant
    assert not stale.exists() and scratch.located(meant) == meant


def test_a_path_outside_a_scratch_folder_is_written_where_it_was_meant(tmp_path, monkeypatch):
    memory = _twin_root(tmp_path, monkeypatch)
    (memory / "elsewhere").mkdir()
    meant = str(tmp_path / "elsewhere" / "capture.safetensors")
    assert scratch.write_path(meant, 10) == meant and scratch.located(meant) == meant
    assert scratch.write_path("capture.safetensors", 10) == "capture.safetensors"


def test_no_twin_when_tmpdir_is_the_users_choice(monkeypatch):
    monkeypatch.setenv("TMPDIR", "/somewhere/else")
    assert not scratch._memory_root_usable()


def test_memory_is_kept_for_the_workers(monkeypatch, tmp_path):
    gib = scratch.GIB
    monkeypatch.setattr(scratch, "_meminfo", lambda: {"MemTotal": 24 * gib, "MemAvailable": 12 * gib})
    assert scratch._room_in_memory(tmp_path, 1 * gib) == (scratch.shutil.disk_usage(tmp_path).free >= gib + 64 * 2**20)
    assert not scratch._room_in_memory(tmp_path, 8 * gib)  # 4 GiB left < a fifth of 24 GiB
    monkeypatch.setattr(scratch, "_meminfo", lambda: {})
    assert not scratch._room_in_memory(tmp_path, 1)


@pytest.mark.skipif(not scratch._memory_root_usable(), reason="no writable tmpfs at /dev/shm (or TMPDIR is set)")
def test_a_workers_reference_and_capture_land_in_memory_and_are_judged_from_there():
    from e2eprof.checks.correctness import compare_captures
    from e2eprof.harness.protocol import ArmSpec, WorkerSetup, scratch_path
    from e2eprof.harness.worker import ArmWorker
    from e2eprof.kernels.fastsoftmax.patch import PATCH

    folder, _ = scratch.create()
    try:
        worker = ArmWorker(WorkerSetup(arm=ArmSpec("baseline", "sdpa", False), model="gpt2-tiny", patch_spec="fastsoftmax",
                                       device="cpu", precision="fp32", seed=0, batch=2, seq=16, new_tokens=4,
                                       scratch_dir=str(folder)))
        worker.build()
        meant = scratch_path(str(folder), "fp64", "train", "reference")
        reference = worker.reference("train", meant)
        capture = worker.capture("train", scratch_path(str(folder), "baseline", "train", "capture"), verify=False)
        for answer in (reference, capture):
            assert answer["path"].startswith(str(scratch.MEMORY_ROOT / folder.name)), answer["path"]
        assert scratch.located(meant) == reference["path"] and not os.path.exists(meant)
        rows = compare_captures("train", reference["path"], {"baseline": capture["path"]}, PATCH, "fp32")
        assert rows and all(r["passed"] for r in rows)
    finally:
        scratch.remove(folder)
    assert not (scratch.MEMORY_ROOT / folder.name).exists()
