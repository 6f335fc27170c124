"""The engine for the server: the front-end on the event loop, the core elsewhere.

The front-end (tokenizer, images, detokenization, stop strings: engine/frontend/) works on the
event loop and its worker threads. The core (scheduler, model, sampler) runs in its own
process by default, so the per-token work of hundreds of streams never competes with it for
the GIL; or, with ``core_process=False``, on a thread of this process. Requests (already
tokenized) and aborts go to the core; its token outputs come back in batches, which the event
loop turns into each request's outputs.

The core's process is spawned (CUDA cannot start in a forked child), so a script that builds
an AsyncLLM at import time needs the usual ``if __name__ == "__main__":`` guard.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator

from autoglm_serve.config import EngineConfig
from autoglm_serve.engine.core.engine_core import CoreOutput
from autoglm_serve.engine.process.core_client import ProcessCoreClient, ThreadCoreClient
from autoglm_serve.engine.stats import CoreStats, EngineInfo
from autoglm_serve.engine.frontend.frontend import Frontend
from autoglm_serve.engine.frontend.input_processor import PreparedPrompt
from autoglm_serve.engine.frontend.output_collector import RequestOutputCollector
from autoglm_serve.engine.settings import resolve_settings
from autoglm_serve.outputs import RequestError, RequestOutput
from autoglm_serve.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """The waiting queue is at its limit (HTTP 503)."""


class EngineDeadError(RuntimeError):
    """The engine core stopped; the server cannot serve any more."""


class RequestFailedError(RuntimeError):
    """The engine failed this one request (engine/core/fault_isolation.py) and serves on."""

    def __init__(self, error: RequestError):
        super().__init__(error.message)
        self.error = error


class AsyncLLM:
    def __init__(self, config: EngineConfig, max_waiting: int = 4096, core_process: bool = True):
        self.config = config
        self.max_waiting = max_waiting
        settings = resolve_settings(config)   # a bad setting fails here, before any load
        if core_process:
            self.client = ProcessCoreClient(settings)   # loads the model while we go on
            try:
                self.frontend = Frontend(settings)
                self.info: EngineInfo = self.client.wait_ready()
            except BaseException:
                self.client.shutdown(timeout=0)
                raise
        else:
            self.client = ThreadCoreClient(settings)
            self.frontend = Frontend(settings)
            self.info = self.client.wait_ready()
        self.tokenizer = self.frontend.tokenizer
        self.stats = CoreStats()
        self.dead: BaseException | None = None
        self.on_dead = None     # called on the event loop once the core has stopped (server)
        self._collectors: dict[str, RequestOutputCollector] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        # core outputs that arrived while the event loop was busy: handled in one go
        self._arrived: list[CoreOutput] = []
        self._arrived_stats = self.stats
        self._arrived_lock = threading.Lock()
        self._drain_scheduled = False

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self.client.start(self._loop, self._on_core_outputs, self._on_core_failed)

    def shutdown(self, timeout: float = 10.0) -> None:
        self.client.shutdown(timeout)

    @property
    def num_unfinished(self) -> int:
        return len(self._collectors)

    # ---- requests -------------------------------------------------------------------------
    async def generate(self, request_id: str, prompt: PreparedPrompt | str | list[int],
                       params: SamplingParams, add_special_tokens: bool = True, mm_items=(),
                       mrope=None, delta: bool = True) -> AsyncIterator[RequestOutput]:
        """Yields outputs as tokens arrive (only the new part each time when ``delta``; what
        arrived while the caller was busy comes as one output). Stopping the iteration (client
        gone) aborts the request. Prepare the prompt with ``self.frontend.prepare`` /
        ``prepare_chat`` (in a worker thread when it has images)."""
        if self.dead is not None:
            raise EngineDeadError(f"the engine stopped: {self.dead!r}")
        if self._loop is None:
            raise RuntimeError("AsyncLLM.start() was not called")
        if self.stats.num_waiting >= self.max_waiting:
            raise QueueFullError(f"the server's queue is full ({self.max_waiting} waiting "
                                 "requests); retry later")
        if request_id in self._collectors:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not isinstance(prompt, PreparedPrompt):
            prompt = PreparedPrompt(self.frontend.input_processor.tokenize(prompt,
                                                                           add_special_tokens),
                                    prompt if isinstance(prompt, str) else None,
                                    list(mm_items), mrope)
        requests = self.frontend.input_processor.make_requests(request_id, prompt, params)
        collector = RequestOutputCollector(delta)
        self._collectors[request_id] = collector
        self.frontend.output_processor.add(request_id, prompt.text, requests, delta)
        self.client.add(requests)
        finished = False
        try:
            while True:
                item = await collector.get()
                if isinstance(item, EngineDeadError):
                    raise item
                if isinstance(item, BaseException):
                    raise EngineDeadError(f"the engine stopped: {item!r}") from item
                if item.error is not None:
                    finished = True
                    raise RequestFailedError(item.error)
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            self._collectors.pop(request_id, None)
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        child_ids = self.frontend.output_processor.abort(request_id)
        if child_ids and self.dead is None:
            self.client.abort(child_ids)

    # ---- from the core client (its thread, or the event loop) -----------------------------
    def _on_core_outputs(self, outputs: list[CoreOutput], stats: CoreStats) -> None:
        with self._arrived_lock:
            self._arrived += outputs
            self._arrived_stats = stats
            if self._drain_scheduled:
                return
            self._drain_scheduled = True
        self._call_on_loop(self._handle_arrived)

    def _on_core_failed(self, exc: BaseException) -> None:
        if self.dead is not None:    # the first report says why; a later one only that it died
            return
        logger.error("the engine core stopped: %s", exc)
        self.dead = exc
        self._call_on_loop(self._fail_all, exc)

    def _call_on_loop(self, fn, *args) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:   # the loop is closed: the server has stopped
            pass

    # ---- back on the event loop -----------------------------------------------------------
    def _handle_arrived(self) -> None:
        with self._arrived_lock:
            outputs, self._arrived = self._arrived, []
            self.stats = self._arrived_stats
            self._drain_scheduled = False
        results, to_abort = self.frontend.output_processor.process(outputs)
        if to_abort:
            self.client.abort(to_abort)
        for out in results:
            collector = self._collectors.get(out.request_id)
            if collector is not None:
                collector.put(out)

    def stop_requests(self, reason: str) -> None:
        """Ends every request in flight with EngineDeadError(reason) (a server shutting
        down); the core is told to abort them as their streams close."""
        self._fail_all(EngineDeadError(reason), report=False)

    def _fail_all(self, exc: BaseException, report: bool = True) -> None:
        for collector in self._collectors.values():
            collector.put(exc)
        if report and self.on_dead is not None:
            self.on_dead()
