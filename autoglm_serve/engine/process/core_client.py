"""The server's handle on its engine core: in its own process (ProcessCoreClient, the default)
or on a thread of the server's process (ThreadCoreClient, --no-engine-process).

Both take requests and aborts from the event loop without blocking it, and call back with
each batch of core outputs (on_outputs) or with the error that stopped the core (on_failed),
from the event loop or from a thread of theirs: the callbacks must take either.
"""
from __future__ import annotations

import asyncio
import atexit
import logging
import multiprocessing
import queue
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import wait

from autoglm_serve.engine.core.engine_core import CoreOutput
from autoglm_serve.engine.process.core_loop import run_core_loop
from autoglm_serve.engine.process.core_messages import (AbortRequests, AddRequests, CoreFailed,
                                                CoreOutputs, CoreReady, Shutdown)
from autoglm_serve.engine.process.core_process import run_core_process
from autoglm_serve.engine.stats import CoreStats, EngineInfo, engine_info
from autoglm_serve.engine.core.request import Request
from autoglm_serve.engine.settings import EngineSettings
from autoglm_serve.engine.process.tensor_channel import TensorChannel
from autoglm_serve.engine.process.stop_signals import start_deaf_to_stop_signals

logger = logging.getLogger(__name__)

OnOutputs = Callable[[list[CoreOutput], CoreStats], None]
OnFailed = Callable[[BaseException], None]


class EngineStartError(RuntimeError):
    """The engine core process ended before it was ready, without saying why."""


class ProcessCoreClient:
    """Messages to the core go through a sending thread (pickling a request with its images
    stays off the event loop); the core's messages are read on the event loop itself, when
    its socket is readable, so no thread has to win the GIL from a busy loop to hand them
    over."""

    def __init__(self, settings: EngineSettings):
        """Spawns the core process, which starts loading the model; wait_ready() waits for it
        (the front-end builds its tokenizer meanwhile)."""
        ctx = multiprocessing.get_context("spawn")   # CUDA cannot initialise in a forked child
        conn, child_conn = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=run_core_process, name="autoglm-engine-core",
                                   args=(settings, child_conn, logging.getLogger().level))
        start_deaf_to_stop_signals(self.process)
        child_conn.close()   # the child holds the only copy: its death reads as end-of-file here
        self.channel = TensorChannel(conn)
        self._outbox: queue.Queue = queue.Queue()
        self._sender: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_outputs: OnOutputs | None = None
        self._on_failed: OnFailed | None = None
        self._closing = False
        self.info: EngineInfo | None = None
        atexit.register(self.shutdown)

    def wait_ready(self) -> EngineInfo:
        """Blocks until the core is built; raises its start-up error."""
        while not wait([self.channel, self.process.sentinel], timeout=1.0):
            pass
        try:
            (msg,) = self.channel.recv()
        except (EOFError, OSError):
            msg = None
        if isinstance(msg, CoreReady):
            self.info = msg.info
            return self.info
        self.shutdown()
        if isinstance(msg, CoreFailed):
            msg.error.add_note(f"in the engine core process:\n{msg.traceback}")
            raise msg.error
        raise EngineStartError(f"the engine core process {self._how_it_ended()} while "
                               "starting; its log above says why")

    def start(self, loop: asyncio.AbstractEventLoop, on_outputs: OnOutputs,
              on_failed: OnFailed) -> None:
        self._loop, self._on_outputs, self._on_failed = loop, on_outputs, on_failed
        loop.add_reader(self.channel.fileno(), self._on_readable)
        self._sender = threading.Thread(target=self._send, name="core-client-output",
                                        daemon=True)
        self._sender.start()

    def add(self, requests: list[Request]) -> None:
        self._outbox.put(AddRequests(requests))

    def abort(self, request_ids: list[str]) -> None:
        self._outbox.put(AbortRequests(request_ids))

    def shutdown(self, timeout: float = 10.0) -> None:
        """Asks the core to stop, and kills it if it has not within ``timeout`` seconds."""
        if self._closing:
            return
        self._closing = True
        atexit.unregister(self.shutdown)
        self._stop_reading()
        if self._sender is not None:
            self._outbox.put(Shutdown())   # also ends the sending thread if the process is gone
        elif self.process.is_alive():
            try:
                self.channel.send([Shutdown()])
            except OSError:
                pass
        self.process.join(timeout)
        if self.process.is_alive():
            logger.warning("the engine core process did not stop within %.0f s: killing it",
                           timeout)
            self.process.kill()
            self.process.join()
        if self._sender is not None:
            self._sender.join(timeout)
        self.channel.close()

    # ---- on the event loop ----------------------------------------------------------------
    def _on_readable(self) -> None:
        try:
            for batch in self.channel.recv_ready():
                for msg in batch:
                    if isinstance(msg, CoreOutputs):
                        self._on_outputs(msg.outputs, msg.stats)
                    elif isinstance(msg, CoreFailed):   # the process logged the traceback
                        self._on_failed(msg.error)
        except (EOFError, OSError):
            self._stop_reading()
            if not self._closing:   # its exit code is known once it is reaped: not here
                threading.Thread(target=self._report_death, daemon=True).start()
        except Exception as exc:    # a message we cannot read: the stream is lost, so is the core
            logger.exception("cannot read the engine core's messages")
            self._stop_reading()
            self._on_failed(exc)

    def _report_death(self) -> None:
        self.process.join(5.0)
        self._on_failed(RuntimeError(f"the engine core process {self._how_it_ended()}"))

    def _stop_reading(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.remove_reader(self.channel.fileno())
            except (RuntimeError, ValueError, OSError):   # not from the loop's thread, closed
                pass

    # ---- the sending thread ---------------------------------------------------------------
    def _send(self) -> None:
        while True:
            batch = [self._outbox.get()]
            while not self._outbox.empty():
                batch.append(self._outbox.get_nowait())
            try:
                self.channel.send(batch)
            except OSError:
                return      # the process is gone: the reader reports it
            except BaseException as exc:   # a message that cannot travel is a bug: say so
                logger.exception("cannot send a message to the engine core")
                self._loop.call_soon_threadsafe(self._on_failed, exc)
                return
            if any(isinstance(msg, Shutdown) for msg in batch):
                return

    def _how_it_ended(self) -> str:
        code = self.process.exitcode
        if code is None:
            return f"(pid {self.process.pid}) stopped answering"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"(pid {self.process.pid}) was killed by {name}"
        return f"(pid {self.process.pid}) exited with code {code}"


class ThreadCoreClient:
    """The core on a thread of this process: one process to debug, but the core then shares
    the GIL with the event loop (about half the throughput under many streams)."""

    def __init__(self, settings: EngineSettings):
        from autoglm_serve.engine.core.engine_core import EngineCore
        self.core = EngineCore(settings)
        self.info = engine_info(self.core)
        self._inbox: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    def wait_ready(self) -> EngineInfo:
        return self.info

    def start(self, loop: asyncio.AbstractEventLoop, on_outputs: OnOutputs,
              on_failed: OnFailed) -> None:
        self._thread = threading.Thread(target=self._run, args=(on_outputs, on_failed),
                                        name="engine-core", daemon=True)
        self._thread.start()

    def _run(self, on_outputs: OnOutputs, on_failed: OnFailed) -> None:
        try:
            run_core_loop(self.core, self._inbox, on_outputs,
                          self.core.config.log_stats_interval_s)
        except BaseException as exc:
            logger.exception("the engine core stopped on an error")
            on_failed(exc)

    def add(self, requests: list[Request]) -> None:
        self._inbox.put(AddRequests(requests))

    def abort(self, request_ids: list[str]) -> None:
        self._inbox.put(AbortRequests(request_ids))

    def shutdown(self, timeout: float = 10.0) -> None:
        self._inbox.put(Shutdown())
        if self._thread is not None:
            self._thread.join(timeout)
