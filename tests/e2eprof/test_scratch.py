"""The run's scratch folder: named after its owner, and the folders of killed runs removed by the next run."""

from __future__ import annotations

import os
import subprocess
import sys

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
    left = tmp_path / f"{scratch.PREFIX}{_dead_pid()}@{scratch._host()}-zz9"
    left.mkdir()
    folder, removed = scratch.create()
    assert removed == [left] and folder.parent == tmp_path and folder.is_dir()
    assert scratch._owner(folder.name) == (os.getpid(), scratch._host())
    assert scratch.remove_orphans(tmp_path) == []  # its own folder is alive
