"""The engine core's own process (the server's default): it loads the model from the
EngineConfig, says it is ready (or why it could not start), then steps the core for as long as
the front-end wants.

The main thread reads the socket itself between steps (without waiting while there is work)
and steps; a second thread sends the outputs back (all the steps that finished since its last
send, as one message: a slow reader gets fewer, larger ones while the core keeps going). A
receiving thread would need the GIL, held by the steps' Python, several times a message: on the
H200 a burst of 256 requests took seconds to reach the scheduler that way. The process ignores
SIGINT and SIGTERM: a Ctrl-C or a group-wide SIGTERM (systemd, killpg) reaches the server,
which drains its streams and then stops this process. If the server vanishes without a word,
the closed socket ends this process at once: nobody is left to read what it computes.
"""
from __future__ import annotations

import gc
import logging
import os
import pickle
import queue
import sys
import threading
import traceback
from collections import deque
from multiprocessing.connection import Connection

from autoglm_serve.engine.process.core_loop import run_core_loop
from autoglm_serve.engine.process.core_messages import (CoreFailed, CoreOutputs, CoreReady,
                                                        merge_outputs)
from autoglm_serve.engine.settings import EngineSettings
from autoglm_serve.engine.process.tensor_channel import TensorChannel
from autoglm_serve.engine.process.stop_signals import ignore_stop_signals

logger = logging.getLogger(__name__)


def run_core_process(settings: EngineSettings, conn: Connection, log_level: int) -> None:
    """The process's entry point (a spawned process: CUDA initialises here, not in the
    server)."""
    config = settings.config
    ignore_stop_signals()
    logging.basicConfig(level=log_level, stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    channel = TensorChannel(conn)
    from autoglm_serve.engine.core.engine_core import EngineCore
    from autoglm_serve.engine.stats import engine_info
    try:
        core = EngineCore(settings)
    except BaseException as exc:   # reported to the server, which fails its start with it
        _send_or_exit(channel, [CoreFailed(_picklable(exc), traceback.format_exc())])
        sys.exit(1)
    # What start-up built (the model, the modules of torch and transformers) lives as long as the
    # process: frozen, the collector's full passes no longer walk it. Each such pass stalled the
    # step loop ~200 ms in the CPU profile (380k objects); 12 ms once frozen.
    gc.collect()
    gc.freeze()
    _send_or_exit(channel, [CoreReady(engine_info(core))])

    outbox: queue.Queue = queue.Queue()
    sender = threading.Thread(target=_send, args=(channel, outbox), name="core-output")
    sender.start()
    if core.workers is not None:    # a tensor-parallel worker that died while we were idle
        core.workers.report_death = lambda exc: outbox.put(CoreFailed(exc, ""))
    exit_code = 0
    try:
        run_core_loop(core, _SocketInbox(channel),
                      lambda outputs, stats: outbox.put(CoreOutputs(outputs, stats)),
                      config.log_stats_interval_s)
    except (EOFError, OSError):
        os._exit(1)   # the server is gone without a Shutdown: nobody reads what we compute
    except BaseException as exc:
        logger.exception("the engine core stopped on an error")
        outbox.put(CoreFailed(_picklable(exc), traceback.format_exc()))
        exit_code = 1
    outbox.put(None)
    sender.join()
    channel.close()
    sys.exit(exit_code)


def _send_or_exit(channel: TensorChannel, messages: list) -> None:
    """Sends, or ends this process quietly when the server is gone: nobody reads what it
    computes (a Ctrl-C while it loaded, or a server that vanished)."""
    try:
        channel.send(messages)
    except OSError:
        os._exit(1)


class _SocketInbox:
    """The core loop's inbox (``get``, ``get_nowait``) read straight from the socket by the
    stepping thread; each read of the socket may bring several messages (lists of them)."""

    def __init__(self, channel: TensorChannel):
        self.channel = channel
        self.pending: deque = deque()

    def get(self):
        while not self.pending:
            self.pending.extend(self.channel.recv())
        return self.pending.popleft()

    def get_nowait(self):
        if not self.pending:
            for messages in self.channel.recv_ready():
                self.pending.extend(messages)
        if not self.pending:
            raise queue.Empty
        return self.pending.popleft()


def _send(channel: TensorChannel, outbox: queue.Queue) -> None:
    """Sends until it takes the None that ends the loop."""
    while True:
        batch = [outbox.get()]
        while not outbox.empty():
            batch.append(outbox.get_nowait())
        last = batch.index(None) if None in batch else len(batch)
        if last:
            _send_or_exit(channel, merge_outputs(batch[:last]))
        if last < len(batch):
            return


def _picklable(exc: BaseException) -> BaseException:
    """The exception itself when it survives pickling, else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
