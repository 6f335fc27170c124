"""The server's handle on its engine core: in its own process (ProcessCoreClient, the default)
or on a thread of the server's process (ThreadCoreClient, --no-engine-process).

Both take requests and aborts from the event loop without blocking it, and call back, from a
thread of their own, with each batch of core outputs (on_outputs) or once with the error that
stopped the core (on_failed).
"""
from __future__ import annotations

import atexit
import logging
import multiprocessing
import queue
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import wait

from autoglm_serve.config import EngineConfig
from autoglm_serve.engine.core import CoreOutput
from autoglm_serve.engine.core_loop import run_core_loop
from autoglm_serve.engine.core_messages import (AbortRequests, AddRequests, CoreFailed,
                                                CoreOutputs, CoreReady, Shutdown)
from autoglm_serve.engine.core_process import run_core_process
from autoglm_serve.engine.core_stats import CoreStats, EngineInfo, engine_info
from autoglm_serve.engine.request import Request
from autoglm_serve.engine.tensor_channel import TensorChannel

logger = logging.getLogger(__name__)

OnOutputs = Callable[[list[CoreOutput], CoreStats], None]
OnFailed = Callable[[BaseException], None]


class EngineStartError(RuntimeError):
    """The engine core process ended before it was ready, without saying why."""


class ProcessCoreClient:
    def __init__(self, config: EngineConfig):
        """Spawns the core process, which starts loading the model; wait_ready() waits for it
        (the front-end builds its tokenizer meanwhile)."""
        ctx = multiprocessing.get_context("spawn")   # CUDA cannot initialise in a forked child
        conn, child_conn = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=run_core_process, name="autoglm-engine-core",
                                   args=(config, child_conn, logging.getLogger().level))
        self.process.start()
        child_conn.close()   # the child holds the only copy: its death reads as end-of-file here
        self.channel = TensorChannel(conn)
        self._outbox: queue.Queue = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._closing = False
        self.info: EngineInfo | None = None
        atexit.register(self.shutdown)

    def wait_ready(self) -> EngineInfo:
        """Blocks until the core is built; raises its start-up error."""
        while not wait([self.channel.conn, self.process.sentinel], timeout=1.0):
            pass
        try:
            msg = self.channel.recv()
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

    def start(self, on_outputs: OnOutputs, on_failed: OnFailed) -> None:
        self._threads = [
            threading.Thread(target=self._receive, args=(on_outputs, on_failed),
                             name="core-client-input", daemon=True),
            threading.Thread(target=self._send, args=(on_failed,), name="core-client-output",
                             daemon=True)]
        for t in self._threads:
            t.start()

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
        if self._threads:
            self._outbox.put(Shutdown())   # also ends the sending thread if the process is gone
        elif self.process.is_alive():
            try:
                self.channel.send(Shutdown())
            except OSError:
                pass
        self.process.join(timeout)
        if self.process.is_alive():
            logger.warning("the engine core process did not stop within %.0f s: killing it",
                           timeout)
            self.process.kill()
            self.process.join()
        for t in self._threads:
            t.join(timeout)
        self.channel.close()

    # ---- the client's threads -------------------------------------------------------------
    def _receive(self, on_outputs: OnOutputs, on_failed: OnFailed) -> None:
        while True:
            try:
                msg = self.channel.recv()
            except (EOFError, OSError):
                if not self._closing:
                    self.process.join(5.0)   # for its exit code
                    on_failed(RuntimeError(f"the engine core process {self._how_it_ended()}"))
                return
            if isinstance(msg, CoreOutputs):
                on_outputs(msg.outputs, msg.stats)
            elif isinstance(msg, CoreFailed):   # the process logged the traceback
                on_failed(msg.error)

    def _send(self, on_failed: OnFailed) -> None:
        while True:
            msg = self._outbox.get()
            try:
                self.channel.send(msg)
            except OSError:
                return      # the process is gone: _receive reports it
            except BaseException as exc:   # a message that cannot travel is a bug: say so
                logger.exception("cannot send %s to the engine core", type(msg).__name__)
                on_failed(exc)
                return
            if isinstance(msg, Shutdown):
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

    def __init__(self, config: EngineConfig):
        from autoglm_serve.engine.core import EngineCore
        self.core = EngineCore(config)
        self.info = engine_info(self.core)
        self._inbox: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    def wait_ready(self) -> EngineInfo:
        return self.info

    def start(self, on_outputs: OnOutputs, on_failed: OnFailed) -> None:
        self._thread = threading.Thread(target=self._run, args=(on_outputs, on_failed),
                                        name="engine-core", daemon=True)
        self._thread.start()

    def _run(self, on_outputs: OnOutputs, on_failed: OnFailed) -> None:
        try:
            run_core_loop(self.core, self._inbox, on_outputs)
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
