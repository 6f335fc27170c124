"""The loop that drives an EngineCore for the server, the same on a thread or in a process:
take the requests and aborts that arrived, step, hand the outputs on with the core's stats."""
from __future__ import annotations

import queue
from collections.abc import Callable, Iterator

from autoglm_serve.engine.core import CoreOutput, EngineCore
from autoglm_serve.engine.core_messages import AbortRequests, AddRequests, Shutdown
from autoglm_serve.engine.core_stats import CoreStats, core_stats


def run_core_loop(core: EngineCore, inbox: queue.Queue,
                  emit: Callable[[list[CoreOutput], CoreStats], None]) -> None:
    """Returns on Shutdown; an exception from the core propagates (the caller reports it).

    Stats also go out alone when they changed without a step (an abort while idle), so the
    server's /metrics never shows a finished request as running."""
    last_stats = None
    while True:
        for msg in _arrived(inbox, block=not core.has_unfinished()):
            if isinstance(msg, AddRequests):
                for request in msg.requests:
                    core.add_request(request)
            elif isinstance(msg, AbortRequests):
                core.abort(msg.request_ids)
            elif isinstance(msg, Shutdown):
                return
            else:
                raise TypeError(f"the engine core got an unknown message: {msg!r}")
        outputs = core.step() if core.has_unfinished() else []
        stats = core_stats(core)
        if outputs or stats != last_stats:
            emit(outputs, stats)
            last_stats = stats


def _arrived(inbox: queue.Queue, block: bool) -> Iterator:
    """What is in the inbox now; when ``block``, waits for the first message."""
    try:
        yield inbox.get() if block else inbox.get_nowait()
        while True:
            yield inbox.get_nowait()
    except queue.Empty:
        return
