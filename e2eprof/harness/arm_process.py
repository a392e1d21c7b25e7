"""Parent-side handle on one worker process: start it, send commands, notice when it dies."""

from __future__ import annotations

import multiprocessing as mp

from e2eprof.harness import compile_cache, isolation
from e2eprof.harness import worker_output
from e2eprof.harness.protocol import Command, WorkerSetup


def _run_worker(conn, setup: WorkerSetup) -> None:
    """The spawned process's entry point. The worker's code, and torch with it, is imported there: never in the
    parent, which only speaks the protocol (e2eprof.harness.protocol)."""
    from e2eprof.harness.worker import worker_main

    worker_main(conn, setup)


def spawn(target, args: tuple, name: str, placement: isolation.Placement):
    """Start a worker process running target(its pipe end, *args); return (the process, the parent's pipe end).

    spawn, not fork: a forked child would inherit CUDA state and any patch the parent imported. Its stderr goes
    through the parent's filter (third-party chatter out); its OpenMP settings must be in its environment before it
    loads torch, and so must the run's one compile-cache folder.
    """
    context = mp.get_context("spawn")
    parent_end, child_end = context.Pipe()
    process = context.Process(target=target, args=(child_end, *args), name=name, daemon=True)
    variables = {**compile_cache.environment(), **placement.environment()}
    with worker_output.relayed(), isolation.environment(variables):
        process.start()
    child_end.close()
    return process, parent_end


class ArmFailed(Exception):
    """An arm's worker reported an error or died; `kind` is 'error' or 'crash'."""

    def __init__(self, arm: str, kind: str, message: str, traceback: str = ""):
        super().__init__(f"arm '{arm}' {'crashed' if kind == 'crash' else 'failed'}: {message}")
        self.arm = arm
        self.kind = kind
        self.message = message
        self.traceback = traceback


class ArmProcess:
    """One spawned worker. `send` + `receive` let the parent overlap slow commands (model builds) across arms."""

    def __init__(self, setup: WorkerSetup, prestarted=None):
        """prestarted: (process, pipe) of a process e2eprof.harness.prestart started before the run's checks; it is
        handed `setup` and becomes this arm's worker. Otherwise a process is started now."""
        self.name = setup.arm.name  # a replica's failure is its arm's: the same kernel failed
        self.failed: ArmFailed | None = None
        self._close_requested = False
        if prestarted is not None:
            self._process, self._conn = prestarted
            try:
                self._conn.send(setup)
            except (BrokenPipeError, OSError):  # it died while importing: the first command reports it
                self.failed = self._failure()
            return
        self._process, self._conn = spawn(_run_worker, (setup,), f"e2eprof-{setup.arm.key}", setup.placement)

    def send(self, command: Command) -> None:
        if self.failed:
            raise self.failed
        try:
            self._connection().send((command.name, command.args()))
        except (BrokenPipeError, OSError):
            self._crashed()

    def receive(self):
        if self.failed:
            raise self.failed
        conn = self._connection()
        while not conn.poll(0.5):
            if not self._alive() and not conn.poll(0):
                self._crashed()
        try:
            status, payload = conn.recv()
        except (EOFError, OSError):
            self._crashed()
        if status == "error":
            raise ArmFailed(self.name, "error", f"{payload['type']}: {payload['message']}", payload["traceback"])
        return payload

    def call(self, command: Command):
        self.send(command)
        return self.receive()

    # Hooks a worker group (e2eprof.distributed.launch) overrides: its connection arrives later, its process is torchrun.
    def _connection(self):
        return self._conn

    def _alive(self) -> bool:
        return self._process.is_alive()

    def _failure(self) -> ArmFailed:
        self._process.join(timeout=5)
        return ArmFailed(self.name, "crash", f"worker process exited with code {self._process.exitcode}")

    def _crashed(self):
        self.failed = self._failure()
        raise self.failed

    def _can_ask(self) -> bool:
        """Whether the worker can still take a command."""
        return self._process.is_alive() and not self.failed

    def request_close(self) -> None:
        """Ask the worker to revert and exit, without waiting: a run closes every arm at once."""
        if self._can_ask():
            try:
                self._conn.send(("close", {}))
            except (BrokenPipeError, EOFError, OSError):
                pass
            else:
                self._close_requested = True

    def close(self) -> None:
        if not self._close_requested:
            self.request_close()
        if self._close_requested:
            try:
                if self._conn.poll(10):
                    self._conn.recv()
            except (BrokenPipeError, EOFError, OSError):
                pass
        self._stop()

    def _stop(self) -> None:
        """Wait for the process to exit; terminate it, then kill it, if it will not."""
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(timeout=5)
        if self._process.is_alive():
            self._process.kill()
        self._conn.close()
