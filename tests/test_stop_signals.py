"""The server's children take no Ctrl-C of their own, from their first instruction: a SIGINT
or SIGTERM that reaches one before its entry point ignores them (while it imports) must not end
it."""
from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoglm_serve.engine.process.stop_signals import (ignore_stop_signals,
                                                       start_deaf_to_stop_signals)


def _busy_then_ignore(started) -> None:
    started.send(True)
    time.sleep(1.0)       # a signal now is one that lands while a real child still imports
    ignore_stop_signals()


def _signal_a_starting_child(sig: int) -> None:
    """In a fresh interpreter, where multiprocessing's resource tracker is not running yet (as
    in the server before it spawns the engine core): no semaphore, only a pipe."""
    ctx = multiprocessing.get_context("spawn")
    started, child_end = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_busy_then_ignore, args=(child_end,))
    start_deaf_to_stop_signals(child)
    assert started.poll(60) and started.recv()
    os.kill(child.pid, sig)
    child.join(30)
    # and this process's own mask is as it was: it still takes the signals
    blocked = set(signal.pthread_sigmask(signal.SIG_BLOCK, []))
    print(child.exitcode, sorted(int(s) for s in blocked & {signal.SIGINT, signal.SIGTERM}))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_before_the_child_ignores_it_does_not_end_it(sig):
    code = ("import sys; from tests.test_stop_signals import _signal_a_starting_child; "
            f"_signal_a_starting_child({int(sig)})")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[-2] == "0 []", out.stdout + out.stderr
