"""The parent's handle on one arm's worker group: torchrun with N ranks, rank 0 connected back over a socket.

Same interface as ArmProcess (send / receive / call / close, ArmFailed on failure), so the runner drives a group as it
drives a single worker. torchrun runs in its own session, so Ctrl-C at the terminal reaches only the parent, which
saves what was measured and then closes the group (as single workers ignore SIGINT); it dies with the parent
(torchrun.py) if the parent is killed outright.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Client, Listener
from pathlib import Path

from e2eprof.harness.arm_process import ArmFailed, ArmProcess
from e2eprof.distributed import ENV_ADDRESS, ENV_AUTHKEY, ENV_BACKEND, ENV_ERRORS, ENV_PARENT_PID
from e2eprof.distributed.options import LaunchSpec
from e2eprof.harness.protocol import WorkerSetup

CONNECT_TIMEOUT_S = 600.0  # rank 0 connects after torchrun's rendezvous and `import torch`; a multi-node one waits for nodes
EXIT_TIMEOUT_S = 30.0  # torchrun's agent notices a dead rank, stops the others and exits within this


def launch_env(device: str, address: tuple[str, int], authkey: bytes, errors_dir: Path) -> dict[str, str]:
    """The group's environment: ours (PYTHONPATH included, so ranks import this same e2eprof), plus the channel."""
    env = dict(os.environ)
    env.update({ENV_ADDRESS: f"{address[0]}:{address[1]}", ENV_AUTHKEY: authkey.hex(), ENV_ERRORS: str(errors_dir),
                ENV_BACKEND: "nccl" if device.startswith("cuda") else "gloo", ENV_PARENT_PID: str(os.getpid())})
    if device.startswith("cuda"):
        # NVLink multicast (NVLS) is off on the lent multi-GPU machines; a user's own setting wins.
        env.setdefault("NCCL_NVLS_ENABLE", "0")
    return env


class DistArmProcess(ArmProcess):
    """One arm as a torchrun worker group. The group starts at once; rank 0's connection is awaited on first use,
    so several arms' groups start (and build, under _broadcast) at the same time."""

    def __init__(self, setup: WorkerSetup, launch: LaunchSpec, arm_index: int):
        self.name = setup.arm.name
        self.failed: ArmFailed | None = None
        self._close_requested = False
        self._setup = setup
        self._conn = None
        self._authkey = secrets.token_bytes(32)
        self._listener = Listener(("127.0.0.1", 0), authkey=self._authkey)
        self._errors = Path(tempfile.mkdtemp(prefix=f"dist-{self.name}-", dir=setup.scratch_dir))
        self._log_path = self._errors / "torchrun.log"
        self._accepted: list = []
        self._acceptor = threading.Thread(target=self._accept, name=f"e2eprof-accept-{self.name}", daemon=True)
        self._acceptor.start()
        command = [sys.executable, "-m", "e2eprof.distributed.torchrun", *launch.torchrun_args(arm_index),
                   "-m", "e2eprof.distributed.rank"]
        with open(self._log_path, "wb") as log:
            self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                             env=launch_env(setup.device, self._listener.address, self._authkey, self._errors),
                                             start_new_session=True)

    def _accept(self) -> None:
        try:
            self._accepted.append(self._listener.accept())
        except (OSError, EOFError) as exc:  # closed, or a connection that failed the authkey challenge
            self._accepted.append(exc)

    def _connection(self):
        if self._conn is not None:
            return self._conn
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while not self._accepted:
            if not self._alive():
                self._acceptor.join(0.5)  # it may have connected just before dying: read what it said
                if not self._accepted:
                    self._crashed()
            if time.monotonic() > deadline:
                self.failed = ArmFailed(self.name, "crash", f"rank 0 did not connect within {CONNECT_TIMEOUT_S:.0f} s")
                raise self.failed
            self._acceptor.join(0.2)
        accepted = self._accepted[0]
        if isinstance(accepted, BaseException):
            self.failed = ArmFailed(self.name, "crash", f"rank 0 could not connect: {accepted}")
            raise self.failed
        self._conn = accepted
        self._conn.send(self._setup)  # the first message: what the group is (rank 0 broadcasts it)
        return self._conn

    def _alive(self) -> bool:
        return self._process.poll() is None

    def _failure(self) -> ArmFailed:
        """Which rank failed first and how: the earliest rank's error when a rank raised, else the rank that died.

        A rank that dies outright (a segfault, os._exit) leaves no error file, but the ranks waiting for it in a
        collective then raise and do, so their errors are consequences. torchrun's report lists every failed rank
        with its exit code: one that left no error file and was not stopped by torchrun itself (SIGTERM) crashed.
        """
        try:
            code = self._process.wait(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        errors = sorted((json.loads(p.read_text()) for p in self._errors.glob("rank*.json")), key=lambda e: e["unix_ns"])
        raised = {e["rank"] for e in errors}
        crashed = [(r, c) for r, c in _failed_ranks(self._log_path) if r not in raised and c != -signal.SIGTERM]
        if crashed:
            rank, exit_code = crashed[0]
            signal_note = f" (signal {-exit_code})" if exit_code < 0 else ""
            return ArmFailed(self.name, "crash", f"rank {rank} exited with code {exit_code}{signal_note}")
        if errors:
            first = errors[0]
            # The rank goes last so an out-of-memory message still starts with its type (sweep.is_oom).
            return ArmFailed(self.name, "error", f"{first['type']}: {first['message']} (rank {first['rank']})",
                             first["traceback"])
        return ArmFailed(self.name, "crash", f"worker group exited with code {code}")

    def _can_ask(self) -> bool:
        # A group that never connected has nothing to ask.
        return self._conn is not None and self._alive() and not self.failed

    def _stop(self) -> None:
        self._stop_group()
        if self._conn is not None:
            self._conn.close()
        self._release_acceptor()

    def _stop_group(self) -> None:
        """Wait for torchrun to exit; SIGTERM its session (it stops its ranks), then SIGKILL if it will not go."""
        for sig, wait_s in ((None, EXIT_TIMEOUT_S), (signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
            if sig is not None:
                try:
                    os.killpg(self._process.pid, sig)  # its own session: the group id is torchrun's pid
                except ProcessLookupError:
                    return
            try:
                self._process.wait(timeout=wait_s)
                return
            except subprocess.TimeoutExpired:
                continue

    def _release_acceptor(self) -> None:
        # accept() does not return when its socket is closed from another thread: connect once to let it go.
        if self._acceptor.is_alive():
            try:
                Client(self._listener.address, authkey=self._authkey).close()
            except OSError:
                pass
            self._acceptor.join(5)
        for accepted in self._accepted:
            if not isinstance(accepted, BaseException) and accepted is not self._conn:
                accepted.close()
        self._listener.close()


def _failed_ranks(log_path: Path) -> list[tuple[int, int]]:
    """(rank, exit code) of every failure in torchrun's report in its log, its root cause first; [] if none."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return []
    failures, _, root = text.rpartition("Root Cause")
    entry = re.compile(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.DOTALL)
    found = entry.findall(root) + entry.findall(failures[failures.rfind("Failures:"):]) if root else []
    return [(int(r), int(c)) for r, c in found]


def start_arm(setup: WorkerSetup, launch: LaunchSpec | None, arm_index: int, prestarted=None) -> ArmProcess:
    """A single worker process (prestarted: one e2eprof.harness.prestart started early), or a torchrun worker
    group when the run is data-parallel."""
    return ArmProcess(setup, prestarted) if launch is None else DistArmProcess(setup, launch, arm_index)
