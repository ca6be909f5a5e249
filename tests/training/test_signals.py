"""training/signals.py: a stop signal finishes the unit of work instead of killing it; time limits stop early."""

import os
import signal
import time
from types import SimpleNamespace

from hf_dspark.training.signals import StopSignal, must_stop


def test_sigterm_sets_the_flag_then_a_second_acts_as_before_and_the_handler_is_restored():
    calls = []
    before = signal.signal(signal.SIGTERM, lambda *a: calls.append(a[0]))
    try:
        mine = signal.getsignal(signal.SIGTERM)
        with StopSignal() as stop:
            assert not stop.received
            os.kill(os.getpid(), signal.SIGTERM)
            assert stop.received and calls == []  # the process lives on to save
            os.kill(os.getpid(), signal.SIGTERM)
            assert calls == [signal.SIGTERM]  # the second reaches the handler installed before
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)


def test_must_stop_on_a_signal_or_before_a_step_that_would_pass_the_limit():
    one = SimpleNamespace(num_processes=1)
    now = time.perf_counter()
    assert must_stop(one, now, 1, None, signalled=True)
    assert not must_stop(one, now, 1, None, signalled=False)
    assert must_stop(one, now - 50, 1, 1.0, signalled=False)  # 50 s done, a step of 50 s would pass 60 s
    assert not must_stop(one, now - 50, 10, 1.0, signalled=False)  # steps of 5 s: one more fits
