"""harness.pool.overlapped: untimed commands overlap across arms; an arm that runs out of memory beside others is retried
alone. Real worker processes run this path in every compare test (the correctness gate); here the arms are small
in-process stand-ins so that "out of memory only while another arm works" can be provoked on purpose."""

from types import SimpleNamespace

from e2eprof.harness.arm_process import ArmFailed
from e2eprof.harness.pool import Pending, call, overlapped
from e2eprof.harness.protocol import Build, Capture
from e2eprof.sweep import OOM_METRIC

OOM = "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


class Device:
    """What the arms share: how many commands are in flight at once."""

    def __init__(self):
        self.in_flight = 0
        self.log: list[str] = []
        self.commands: list[tuple[str, str]] = []  # (arm, command) in the order sent


class StandIn:
    """An arm that answers after its command is 'sent'; `fails` decides, from the arms in flight, how it fails."""

    def __init__(self, name, device, fails=lambda in_flight: None):
        self.name, self.device, self.fails = name, device, fails
        self.pending = None

    def send(self, command):
        self.device.in_flight += 1
        self.device.log.append(f"send {self.name}")
        self.device.commands.append((self.name, command.name))
        self.pending = (command.name, command.args(), self.device.in_flight)

    def receive(self):
        command, kwargs, in_flight = self.pending
        self.device.in_flight -= 1
        self.device.log.append(f"receive {self.name}")
        problem = self.fails(max(in_flight, self.device.in_flight + 1))
        if problem:
            raise ArmFailed(self.name, "error", problem)
        return {"arm": self.name, "command": command, **kwargs}

    def call(self, command):
        self.send(command)
        return self.receive()


def state():
    return SimpleNamespace(arm_failures={}, out_of_memory=set(), correctness=[], pending={})


def test_every_command_is_sent_before_any_answer_is_awaited():
    device = Device()
    arms = {n: StandIn(n, device) for n in ("a", "b", "c")}
    results = overlapped(arms, state(), {n: Capture("train", "capture.safetensors", verify=False) for n in arms})
    assert device.log[:3] == ["send a", "send b", "send c"]
    assert sorted(results) == ["a", "b", "c"] and results["b"]["command"] == "capture"


def test_an_arm_out_of_memory_beside_others_is_retried_alone_and_kept():
    device = Device()
    arms = {"a": StandIn("a", device),
            "big": StandIn("big", device, fails=lambda in_flight: OOM if in_flight > 1 else None)}
    s = state()
    results = overlapped(arms, s, {n: Capture("train", "capture.safetensors", verify=False) for n in arms})
    assert sorted(results) == ["a", "big"]
    assert s.correctness == [] and not s.out_of_memory and not s.arm_failures
    assert device.log[-2:] == ["send big", "receive big"]  # the retry ran with nothing else in flight


def test_out_of_memory_alone_too_is_recorded_and_the_arm_sits_the_workload_out():
    device = Device()
    arms = {"a": StandIn("a", device), "big": StandIn("big", device, fails=lambda in_flight: OOM)}
    s = state()
    results = overlapped(arms, s, {n: Capture("train", "capture.safetensors", verify=False) for n in arms})
    assert sorted(results) == ["a"]
    assert s.out_of_memory == {("big", "train")}
    assert [r["metric"] for r in s.correctness] == [OOM_METRIC]


def test_an_error_is_recorded_once_and_not_retried():
    device = Device()
    arms = {"a": StandIn("a", device), "bad": StandIn("bad", device, fails=lambda in_flight: "ValueError: wrong")}
    s = state()
    results = overlapped(arms, s, {n: Capture("infer", "capture.safetensors", verify=False) for n in arms})
    assert sorted(results) == ["a"] and list(s.arm_failures) == ["bad"]
    assert device.log.count("send bad") == 1
    assert [r["metric"] for r in s.correctness] == ["arm_failed"]


def test_arms_already_failed_or_out_of_memory_are_not_asked():
    device = Device()
    arms = {n: StandIn(n, device) for n in ("a", "gone", "full")}
    s = state()
    s.arm_failures["gone"] = ArmFailed("gone", "crash", "exit 1")
    s.out_of_memory.add(("full", "train"))
    results = overlapped(arms, s, {n: Capture("train", "capture.safetensors", verify=False) for n in arms})
    assert sorted(results) == ["a"] and device.log == ["send a", "receive a"]


def test_without_retry_an_out_of_memory_arm_is_recorded_at_once():
    # harness.pool.broadcast (model builds): every model lives beside the others for the whole run, so no retry alone.
    device = Device()
    arms = {"a": StandIn("a", device),
            "big": StandIn("big", device, fails=lambda in_flight: OOM if in_flight > 1 else None)}
    s = state()
    results = overlapped(arms, s, {n: Build() for n in arms}, retry_out_of_memory=False)
    assert sorted(results) == ["a"] and list(s.arm_failures) == ["big"]
    assert device.log.count("send big") == 1


def test_before_a_retry_alone_the_other_processes_empty_their_caches():
    # The retry shares the device with every other process's allocator cache: they give it back first, and only
    # they do (the arm being retried has already released its own after the failure).
    device = Device()
    arms = {"a": StandIn("a", device), "b": StandIn("b", device),
            "big": StandIn("big", device, fails=lambda in_flight: OOM if in_flight > 1 else None)}
    results = overlapped(arms, state(), {n: Capture("train", "capture.safetensors", verify=False) for n in arms})
    assert sorted(results) == ["a", "b", "big"]
    assert device.commands[3:] == [("a", "release_cached_memory"), ("b", "release_cached_memory"), ("big", "capture")]


def test_no_out_of_memory_means_no_release():
    device = Device()
    arms = {n: StandIn(n, device) for n in ("a", "b")}
    overlapped(arms, state(), {n: Capture("train", "capture.safetensors", verify=False) for n in arms})
    assert [command for _, command in device.commands] == ["capture", "capture"]


def test_a_pending_command_runs_on_while_the_others_are_asked_and_answers_later():
    # The compile arm's capture: sent first, the others sent, answered and compared meanwhile, its answer taken last.
    device = Device()
    arms = {n: StandIn(n, device) for n in ("late", "a", "b")}
    s = state()
    late = Pending(arms, s, "late", Capture("train", "late.safetensors", verify=False))
    results = overlapped(arms, s, {n: Capture("train", "capture.safetensors", verify=False) for n in ("a", "b")})
    assert sorted(results) == ["a", "b"] and "receive late" not in device.log
    assert call(arms, s, "a", Build())["command"] == "build"
    assert device.log[0] == "send late" and "receive late" not in device.log
    assert late.result()["path"] == "late.safetensors" and late.result() is late.result()
    assert device.log.count("receive late") == 1 and s.pending == {}


def test_a_process_with_a_pending_command_answers_it_before_it_gets_another():
    # One command at a time per process: a release of every cache (before an arm is retried alone) first takes the
    # pending answer, so the retry finds every other process idle, the pending one included.
    device = Device()
    arms = {"late": StandIn("late", device), "a": StandIn("a", device),
            "big": StandIn("big", device, fails=lambda in_flight: OOM if in_flight > 1 else None)}
    s = state()
    late = Pending(arms, s, "late", Capture("train", "late.safetensors", verify=False))
    results = overlapped(arms, s, {n: Capture("train", "capture.safetensors", verify=False) for n in ("a", "big")})
    assert sorted(results) == ["a", "big"]
    assert device.log.index("receive late") < device.log.index("send late", 1)  # answered, then asked to release
    assert device.commands[-3:] == [("late", "release_cached_memory"), ("a", "release_cached_memory"), ("big", "capture")]
    assert late.result()["path"] == "late.safetensors" and device.log[-2:] == ["send big", "receive big"]


def test_a_pending_command_out_of_memory_is_asked_again_alone_and_an_error_is_recorded():
    device = Device()
    answers = []  # out of memory the first time (beside "a"), fine when asked again alone

    def first_time_out_of_memory(in_flight):
        answers.append(in_flight)
        return OOM if len(answers) == 1 else None

    arms = {"a": StandIn("a", device), "late": StandIn("late", device, fails=first_time_out_of_memory)}
    s = state()
    late = Pending(arms, s, "late", Capture("train", "late.safetensors", verify=False))
    overlapped(arms, s, {"a": Capture("train", "capture.safetensors", verify=False)})
    assert late.result()["path"] == "late.safetensors" and not s.correctness and not s.out_of_memory
    assert device.commands[-2:] == [("a", "release_cached_memory"), ("late", "capture")] and answers[-1] == 1
    bad = {"bad": StandIn("bad", device, fails=lambda in_flight: "ValueError: wrong")}
    assert Pending(bad, s, "bad", Capture("train", "x.safetensors", verify=False)).result() is None
    assert list(s.arm_failures) == ["bad"] and [r["metric"] for r in s.correctness] == ["arm_failed"]


def test_the_real_worker_answers_the_release_command(tmp_path):
    # On the CPU there is no allocator cache to return; the command must still be one the worker knows and leave
    # the arm able to step (on CUDA: tests/gpu/test_out_of_memory_cuda.py).
    from e2eprof.harness.protocol import ArmSpec, WorkerSetup
    from e2eprof.harness.worker import ArmWorker

    arm = ArmWorker(WorkerSetup(arm=ArmSpec("baseline", "sdpa", False), model="gpt2-tiny", patch_spec="fastsoftmax",
                                device="cpu", precision="fp32", seed=0, batch=1, seq=16, new_tokens=4,
                                scratch_dir=str(tmp_path)))
    arm.build()
    assert arm.dispatch("release_cached_memory", {}) == {}
    assert arm.cold("infer")


class ReferenceStandIn(StandIn):
    """The baseline: its fp64 reference runs out of memory while any other process holds its cache."""

    def __init__(self, name, device, caches):
        super().__init__(name, device)
        self.caches = caches

    def receive(self):
        command, kwargs, _ = self.pending
        self.device.in_flight -= 1
        self.device.log.append(f"receive {self.name}")
        if command == "reference" and any(self.caches.values()):
            assert not kwargs["host_fallback"], "the reference moved to the host before the others made room"
            return {"out_of_memory": True}
        return {"arm": self.name, "command": command, **kwargs, "path": kwargs.get("path")}


class CacheHolder(StandIn):
    def __init__(self, name, device, caches):
        super().__init__(name, device)
        self.caches = caches
        caches[name] = True

    def receive(self):
        result = super().receive()
        if result["command"] == "release_cached_memory":
            self.caches[self.name] = False
        return result


def test_a_reference_out_of_memory_beside_the_captures_is_asked_again_once_the_others_emptied_their_caches():
    from e2eprof.harness.protocol import Reference
    from e2eprof.phases.gate import reference_alone

    device, caches = Device(), {}
    arms = {"baseline": ReferenceStandIn("baseline", device, caches),
            **{n: CacheHolder(n, device, caches) for n in ("patched", "sdpa", "patched#1")}}
    calls = {n: Capture("train", f"{n}.safetensors", verify=False) for n in arms if n != "baseline"}
    calls["baseline"] = Reference("train", "fp64.safetensors", host_fallback=False)
    results = overlapped(arms, state(), calls)
    answer = reference_alone(arms, state(), "train", "fp64.safetensors", results.pop("baseline"))
    assert answer["command"] == "reference" and answer["host_fallback"] is True and answer["path"] == "fp64.safetensors"
    assert [c for c in device.commands if c[1] == "release_cached_memory"] == [
        ("patched", "release_cached_memory"), ("sdpa", "release_cached_memory"), ("patched#1", "release_cached_memory")]
    assert device.commands[-1] == ("baseline", "reference")


def test_a_reference_that_fit_is_not_asked_again():
    from e2eprof.phases.gate import reference_alone

    device = Device()
    arms = {"baseline": StandIn("baseline", device), "patched": StandIn("patched", device)}
    first = {"path": "fp64.safetensors", "keys": ["loss"], "device": "cuda"}
    assert reference_alone(arms, state(), "train", "fp64.safetensors", first) is first
    assert device.commands == []
