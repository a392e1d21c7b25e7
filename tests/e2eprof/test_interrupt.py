"""A stop request must not be lost when the signal handler's raise is swallowed (e2eprof.interrupt)."""

import gc
import signal

import pytest

from e2eprof import interrupt
from e2eprof.cli import _stop_once
from e2eprof.harness.pool import call, overlapped
from e2eprof.harness.protocol import Block, Capture
from tests.e2eprof.test_overlapped import Device, StandIn, state


@pytest.fixture(autouse=True)
def restore_handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    interrupt.clear()
    yield
    interrupt.clear()
    for s, handler in saved.items():
        signal.signal(s, handler)


class RaisesInFinalizer:
    """Runs the stop handler from __del__, where Python prints an exception instead of raising it."""

    def __del__(self):
        _stop_once(signal.SIGTERM, None)


def test_a_stop_swallowed_by_a_finalizer_is_raised_at_the_next_worker_command():
    signal.signal(signal.SIGTERM, _stop_once)
    RaisesInFinalizer()  # collected at once: the handler's Terminated is printed as "Exception ignored", not raised
    gc.collect()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # spent: a second SIGTERM would be ignored
    arms = {"baseline": StandIn("baseline", Device())}
    with pytest.raises(interrupt.Terminated):
        call(arms, state(), "baseline", Block("train", 0, 1))
    with pytest.raises(interrupt.Terminated):
        overlapped(arms, state(), {"baseline": Capture("train", "capture.safetensors", verify=False)})


def test_no_request_no_raise_and_a_handled_stop_is_forgotten():
    arms = {"baseline": StandIn("baseline", Device())}
    assert call(arms, state(), "baseline", Block("train", 0, 1))["command"] == "block"
    interrupt.request(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt) as caught:
        interrupt.check()
    assert not isinstance(caught.value, interrupt.Terminated)
    interrupt.clear()
    interrupt.check()
