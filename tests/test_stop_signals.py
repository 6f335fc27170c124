"""The server's children take no Ctrl-C of their own, from their first instruction: a SIGINT
or SIGTERM that reaches one before its entry point ignores them (while it imports) must not end
it."""
from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

from autoglm_serve.engine.process.stop_signals import (ignore_stop_signals,
                                                       start_deaf_to_stop_signals)


def _busy_then_ignore(started) -> None:
    started.set()
    time.sleep(1.0)       # a signal now is one that lands while a real child still imports
    ignore_stop_signals()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_before_the_child_ignores_it_does_not_end_it(sig):
    ctx = multiprocessing.get_context("spawn")
    started = ctx.Event()
    child = ctx.Process(target=_busy_then_ignore, args=(started,))
    start_deaf_to_stop_signals(child)
    assert started.wait(60)
    os.kill(child.pid, sig)
    child.join(30)
    assert child.exitcode == 0
    # and the parent's own mask is as it was: this process still takes the signals
    assert not set(signal.pthread_sigmask(signal.SIG_BLOCK, [])) & {signal.SIGINT, signal.SIGTERM}
