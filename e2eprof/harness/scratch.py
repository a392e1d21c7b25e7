"""A run's scratch folder: the captures and fp64 references its processes hand each other, removed when it ends.

A run killed outright (SIGKILL, the kernel's out-of-memory killer) cannot remove its own folder, and a large model's
captured gradients reach gigabytes in the machine's temporary folder, where nothing else would ever remove them. So
each folder names the host and process that made it, and the next run on that host removes the folders whose
process is gone. Only those: a folder of a live run, of another host sharing the folder (a network home, a
container's mounted /tmp), of another user, or not named by this module is left alone.

Each folder has a twin of the same name in /dev/shm where that is a tmpfs (Linux) and TMPDIR does not say
otherwise: a capture that fits there, with room left in memory, is written to the twin (write_path) and read from
wherever it is (located). gpt2 training's fp64 reference is ~1 GB of gradients, written once and read by the parent
and the revalidation; on a 2-core VM safetensors wrote 1 GiB to /tmp in 3.0 s and to /dev/shm in 0.4 s. A capture
that does not fit goes to the disk folder, as before.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path

PREFIX = "e2eprof-scratch-"
MEMORY_ROOT = Path("/dev/shm")
GIB = 1 << 30


def create() -> tuple[Path, list[Path]]:
    """A new scratch folder in the temporary folder (and its twin in memory, where there is one), and the orphaned
    ones removed before it was made."""
    root = Path(tempfile.gettempdir())
    removed = remove_orphans(root)
    memory = MEMORY_ROOT if _memory_root_usable() else None
    if memory is not None:
        removed += remove_orphans(memory)
    # mkdtemp's random suffix never holds "-" or "@", so the owner can be read back from the name.
    folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}@{_host()}-", dir=root))
    if memory is not None:
        try:
            (memory / folder.name).mkdir(mode=0o700)
        except OSError:
            pass  # no twin: every capture goes to the disk folder
    return folder, removed


def remove(folder: Path) -> None:
    """Remove a run's scratch folder and its twin in memory."""
    shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(MEMORY_ROOT / folder.name, ignore_errors=True)


def write_path(path: str, nbytes: int) -> str:
    """Where a capture of `nbytes` meant for `path` (in a scratch folder) is written: its twin in memory when the
    folder has one with room for it and the machine keeps enough memory free beside it, else `path`. A copy of the
    same name in the other place is removed, so located() never finds a stale one."""
    twin = _twin(path)
    if twin is None:
        return path
    chosen, other = (str(twin), path) if twin.parent.is_dir() and _room_in_memory(twin.parent, nbytes) else (path, str(twin))
    try:
        os.remove(other)
    except OSError:
        pass
    return chosen


def located(path: str) -> str:
    """Where the capture meant for `path` was written (write_path)."""
    twin = _twin(path)
    return str(twin) if twin is not None and twin.exists() else path


def _twin(path: str) -> Path | None:
    """The place in memory of a file meant for a scratch folder; None for a path outside one."""
    folder = Path(path).parent.name
    return MEMORY_ROOT / folder / Path(path).name if folder.startswith(PREFIX) else None


def _memory_root_usable() -> bool:
    """/dev/shm is a tmpfs this user can write, and TMPDIR (the user's choice of scratch place) is not set."""
    if os.environ.get("TMPDIR") or not sys.platform.startswith("linux"):
        return False
    try:
        with open("/proc/mounts") as mounts:
            tmpfs = any(f.split()[1:3] == [str(MEMORY_ROOT), "tmpfs"] for f in mounts if len(f.split()) > 2)
    except OSError:
        return False
    return tmpfs and os.access(MEMORY_ROOT, os.W_OK)


def _room_in_memory(folder: Path, nbytes: int) -> bool:
    """The tmpfs has room for nbytes, and after it the machine still has a fifth of its memory (at least 4 GiB)
    available: a tmpfs file is memory that nothing can page out without swap, and the workers' models need theirs."""
    try:
        free = shutil.disk_usage(folder).free
        meminfo = _meminfo()
    except OSError:
        return False
    total, available = meminfo.get("MemTotal"), meminfo.get("MemAvailable")
    if total is None or available is None:
        return False
    return free >= nbytes + 64 * (1 << 20) and available - nbytes >= max(4 * GIB, total // 5)


def _meminfo() -> dict[str, int]:
    """/proc/meminfo's fields in bytes."""
    fields = {}
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            name, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                fields[name] = int(parts[0]) * 1024
    return fields


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
