"""Commands to a run's arm processes: one at a time, to all, or overlapped where nothing is timed. A process that
fails is recorded (not raised) and its arm left out from then on, so every other arm's data is kept."""

from __future__ import annotations

import math

from e2eprof import interrupt
from e2eprof.harness.arm_process import ArmFailed, ArmProcess
from e2eprof.harness.state import RunState
from e2eprof.harness.protocol import Command, ReleaseCachedMemory, arm_of, is_replica
from e2eprof.sweep import is_oom, oom_row


def broadcast(processes: dict[str, ArmProcess], state: RunState, command: Command) -> dict[str, dict]:
    """Send one command to every live arm, then collect: slow phases (model builds) overlap across arms.

    A failure, out of memory included, is recorded as it comes: a build that does not fit beside the others is not
    retried (an arm that cannot be built alongside the others cannot be measured alongside them either); a
    replica that does not fit is left out and its arm goes on (process_failed).
    """
    return overlapped(processes, state, {name: command for name in processes}, retry_out_of_memory=False)


def process_failed(processes: dict[str, ArmProcess], state: RunState, key: str, failure: ArmFailed, phase: str,
                    workload: str = "*") -> None:
    """A process of an arm failed. A replica that ran out of memory beside the other processes is closed and left
    out, with a row saying so: its arm goes on with fewer processes (and an interval with more process noise).
    Anything else is its arm's failure (the same code failed), recorded by record_failure.
    """
    if is_replica(key) and is_oom(failure):
        state.correctness.append({
            "workload": workload, "arm": arm_of(key), "tensor": "-", "metric": "replica_dropped", "value": 1.0,
            "tolerance": math.nan, "passed": True,  # informational: the arm stays, its interval widens
            "detail": f"{key} ran out of memory during {phase} beside the other processes: {failure.message}"})
        processes.pop(key).close()
        return
    record_failure(state, failure, phase, workload)


def record_failure(state: RunState, failure: ArmFailed, phase: str, workload: str = "*") -> None:
    if is_oom(failure):
        # Not a bug in the arm: this point is too large for it. Recorded, and the arm sits out this workload only
        # (the worker has freed what the workload held); running out while building leaves it nothing to run.
        state.correctness.append(oom_row(workload, failure.arm, phase, failure.message))
        if workload != "*":
            state.out_of_memory.add((failure.arm, workload))
            return
        state.arm_failures[failure.arm] = failure
        return
    state.arm_failures[failure.arm] = failure
    state.correctness.append({"workload": workload, "arm": failure.arm, "tensor": "-", "metric": "arm_failed",
                              "value": math.nan, "tolerance": math.nan, "passed": False,
                              "detail": f"during {phase}: {failure}"})


def left_out(processes, state, key: str, workload: str | None) -> bool:
    """Whether a process gets no more commands: a replica dropped since the caller listed the processes
    (process_failed), an arm that failed, or one out of memory in this workload."""
    return key not in processes or arm_of(key) in state.arm_failures or (arm_of(key), workload) in state.out_of_memory


class Pending:
    """A command sent to one process now and answered later, for untimed work that can run on while the parent
    talks to the other processes (the compile arm's correctness capture, which compiles a second graph).

    A process takes one command at a time: `call` and `overlapped` first wait for a process's pending answer
    before they send it anything, so a release of every cache, or an arm retried alone, still finds the others idle.
    The answer is kept for `result`, which records a failure as `call` does and asks again alone once after running
    out of memory, as `overlapped` does.
    """

    def __init__(self, processes, state, key: str, command: Command):
        self.processes, self.state, self.key, self.command = processes, state, key, command
        self._answered, self._answer = False, None
        interrupt.check()
        settle(state, key)
        if left_out(processes, state, key, command.scope()):
            self._answered = True
            return
        try:
            processes[key].send(command)
        except ArmFailed as failure:
            process_failed(processes, state, key, failure, command.name, command.scope() or "*")
            self._answered = True
            return
        state.pending[key] = self

    def result(self):
        """The answer (waiting for it if it has not come), or None where the process failed."""
        if self._answered:
            return self._answer
        self._answered = True
        self.state.pending.pop(self.key, None)
        processes, state, key, command = self.processes, self.state, self.key, self.command
        try:
            self._answer = processes[key].receive()
        except ArmFailed as failure:
            if is_oom(failure):
                release_caches(processes, state, keep=(key,))
                self._answer = call(processes, state, key, command)
            else:
                process_failed(processes, state, key, failure, command.name, command.scope() or "*")
        return self._answer


def settle(state: RunState, key: str) -> None:
    """Wait for `key`'s pending answer, if it has one (kept for its Pending), before the process gets another
    command."""
    pending = state.pending.get(key)
    if pending is not None:
        pending.result()


def call(processes, state, key: str, command: Command):
    """One command to one arm's process (key: the arm, or "<arm>#<replica>"); a failure is recorded (not raised)
    and the arm, all its processes, is left out from then on."""
    interrupt.check()
    settle(state, key)
    if left_out(processes, state, key, command.scope()):
        return None
    try:
        return processes[key].call(command)
    except ArmFailed as failure:
        process_failed(processes, state, key, failure, command.name, command.scope() or "*")
        return None


def overlapped(processes, state, calls: dict[str, Command], *,
                retry_out_of_memory: bool = True) -> dict[str, object]:
    """One command per arm, all sent before any answer is awaited: untimed work overlaps across arms.

    Only for work that is not timed (correctness captures): the compile arm's recompilation for eval mode, the fp64
    reference and the other arms' captures then take as long as the slowest of them, not their sum. An arm that
    runs out of memory beside the others is asked again alone, as it would have been run before, once every other
    process has emptied its allocator cache; a second failure is recorded like any other (with
    retry_out_of_memory=False, the first). Results by arm; a failed arm is left out.
    """
    interrupt.check()
    sent = []
    for arm in calls:
        settle(state, arm)
    for arm, command in calls.items():
        if left_out(processes, state, arm, command.scope()):
            continue
        try:
            processes[arm].send(command)
            sent.append(arm)
        except ArmFailed as failure:
            process_failed(processes, state, arm, failure, command.name, command.scope() or "*")
    results, alone = {}, []
    for arm in sent:
        try:
            results[arm] = processes[arm].receive()
        except ArmFailed as failure:
            if retry_out_of_memory and is_oom(failure):
                alone.append(arm)
            else:
                process_failed(processes, state, arm, failure, calls[arm].name, calls[arm].scope() or "*")
    if alone:
        # Before the retries, the other processes give their allocator caches back: their own work in this round
        # (captures, an fp64 reference) has just filled them, and an arm retried alone still shares the device
        # with every process's cache. llama-1b's train gate on the H200 ran out this way with two processes per
        # arm and the compile arm beside the fp64 reference.
        release_caches(processes, state, keep=alone)
    for arm in alone:
        result = call(processes, state, arm, calls[arm])
        if result is not None:
            results[arm] = result
    return results


def release_caches(processes, state, keep) -> None:
    """Every process but those in `keep` empties its allocator's cache, all at once: room for a command that ran out
    of memory beside them and is asked again alone."""
    overlapped(processes, state, {key: ReleaseCachedMemory() for key in processes if key not in keep},
               retry_out_of_memory=False)
