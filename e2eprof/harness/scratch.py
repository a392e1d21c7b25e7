"""A run's scratch folder: the captures and fp64 references its processes hand each other, removed when it ends.

A run killed outright (SIGKILL, the kernel's out-of-memory killer) cannot remove its own folder, and a large model's
captured gradients reach gigabytes in the machine's temporary folder, where nothing else would ever remove them. So
each folder names the host and process that made it, and the next run on that host removes the folders whose
process is gone. Only those: a folder of a live run, of another host sharing the folder (a network home, a
container's mounted /tmp), of another user, or not named by this module is left alone.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

PREFIX = "e2eprof-scratch-"


def create() -> tuple[Path, list[Path]]:
    """A new scratch folder in the temporary folder, and the orphaned ones removed before it was made."""
    root = Path(tempfile.gettempdir())
    removed = remove_orphans(root)
    # mkdtemp's random suffix never holds "-" or "@", so the owner can be read back from the name.
    folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}@{_host()}-", dir=root))
    return folder, removed


def remove_orphans(root: Path) -> list[Path]:
    """Remove the scratch folders under `root` that this host's runs left behind when they were killed."""
    removed = []
    for folder in root.glob(f"{PREFIX}*"):
        owner = _owner(folder.name)
        if owner is None or owner[1] != _host() or _alive(owner[0]):
            continue
        try:
            if not folder.is_dir() or folder.is_symlink() or folder.stat().st_uid != os.getuid():
                continue
        except OSError:  # removed meanwhile by another run
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _owner(name: str) -> tuple[int, str] | None:
    """(pid, host) from a folder name this module made, else None."""
    pid, at, rest = name[len(PREFIX):].partition("@")
    if not at or not pid.isdigit() or "-" not in rest:
        return None
    return int(pid), rest.rsplit("-", 1)[0]


def _host() -> str:
    return socket.gethostname().replace("/", "_")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True
