"""The server's children (the engine core, tensor-parallel workers) leave a Ctrl-C or a
group-wide SIGTERM (systemd, killpg) to the server, which drains its streams and then stops
them."""
from __future__ import annotations

import signal
from multiprocessing import resource_tracker

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def start_deaf_to_stop_signals(process) -> None:
    """``process.start()`` with the stop signals blocked in this thread. The child inherits the
    mask, so a Ctrl-C while it still imports (before ignore_stop_signals; seconds on a cold
    cache) cannot end it in a KeyboardInterrupt. multiprocessing's resource tracker is started
    first: a spawn starts it if it is not running, with the same signals blocked around its
    own start and then unblocked, which would leave this child unprotected (the server's first
    spawn is the engine core)."""
    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def ignore_stop_signals() -> None:
    """In the child: ignored from here on, then unblocked (one that came while blocked is
    dropped)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
