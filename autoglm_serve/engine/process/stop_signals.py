"""The server's children (the engine core, tensor-parallel workers) leave a Ctrl-C or a
group-wide SIGTERM (systemd, killpg) to the server, which drains its streams and then stops
them."""
from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def start_deaf_to_stop_signals(process) -> None:
    """``process.start()`` with the stop signals blocked in this thread. The child inherits the
    mask, so a Ctrl-C while it still imports (before ignore_stop_signals; seconds on a cold
    cache) cannot end it in a KeyboardInterrupt (multiprocessing starts its resource tracker
    the same way)."""
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
