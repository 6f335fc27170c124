"""The loop that drives an EngineCore for the server, the same on a thread or in a process:
take the requests and aborts that arrived, step, hand the outputs on with the core's stats."""
from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator

from autoglm_serve.engine.core.engine_core import CoreOutput, EngineCore
from autoglm_serve.engine.process.core_messages import AbortRequests, AddRequests, Shutdown
from autoglm_serve.engine.stats import CoreStats, core_stats
from autoglm_serve.engine.stats import StatsLogger
from autoglm_serve.engine.step_trace import StepTrace


def run_core_loop(core: EngineCore, inbox: queue.Queue,
                  emit: Callable[[list[CoreOutput], CoreStats], None],
                  log_stats_interval_s: float | None = None) -> None:
    """Returns on Shutdown; an exception from the core propagates (the caller reports it).

    Stats also go out alone when they changed without a step (an abort while idle), so the
    server's /metrics never shows a finished request as running. With log_stats_interval_s,
    a line on the engine's pace is logged that often while it works; with the config's
    step_trace_path, a line per step is written there (engine/step_trace.py)."""
    last_stats = None
    stats_logger = StatsLogger(log_stats_interval_s) if log_stats_interval_s else None
    trace = StepTrace(core.config.step_trace_path) if core.config.step_trace_path else None
    if core.workers is not None:
        # a server that lost a tensor-parallel worker while idle exits rather than wait
        core.workers.exit_process_on_death = True
    try:
        while True:
            prompt_tokens_before = core.num_prompt_tokens_total
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
            outputs = []
            if core.has_unfinished():
                t0 = time.monotonic()
                outputs = core.step()
                seconds = time.monotonic() - t0
                if stats_logger is not None:
                    stats_logger.step_done(core, seconds, prompt_tokens_before)
                if trace is not None:
                    trace.step_done(core, seconds)
            stats = core_stats(core)
            if outputs or stats != last_stats:
                emit(outputs, stats)
                last_stats = stats
    finally:
        if stats_logger is not None:
            stats_logger.close()
        if trace is not None:
            trace.close()
        core.shutdown()


def _arrived(inbox: queue.Queue, block: bool) -> Iterator:
    """What is in the inbox now; when ``block``, waits for the first message."""
    try:
        yield inbox.get() if block else inbox.get_nowait()
        while True:
            yield inbox.get_nowait()
    except queue.Empty:
        return
