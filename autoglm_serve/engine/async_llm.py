"""The engine for the server: the core steps on its own thread, asyncio does the rest.

The core thread only schedules, runs the model and samples; it never waits on HTTP. Requests
(already tokenized) and aborts reach it through a queue; its token outputs come back to the
event loop, where the output processor detokenizes them and feeds each request's stream.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

from autoglm_serve.config import EngineConfig
from autoglm_serve.engine.input_processor import PreparedPrompt
from autoglm_serve.engine.llm_engine import LLMEngine
from autoglm_serve.outputs import RequestOutput
from autoglm_serve.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """The waiting queue is at its limit (HTTP 503)."""


class EngineDeadError(RuntimeError):
    """The core thread died; the server cannot serve any more."""


@dataclass
class _Add:
    requests: list


@dataclass
class _Abort:
    child_ids: list[str]


class AsyncLLM:
    def __init__(self, config: EngineConfig, max_waiting: int = 4096):
        # The sync engine owns the core, the tokenizer and the processors; here the core is
        # driven by a thread instead of LLM._run.
        self.engine = LLMEngine(config)
        self.core = self.engine.core
        self.tokenizer = self.engine.tokenizer
        self.max_waiting = max_waiting
        self._inbox: queue.Queue = queue.Queue()
        self._streams: dict[str, asyncio.Queue] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.dead: BaseException | None = None

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._core_loop, name="engine-core", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def num_unfinished(self) -> int:
        return len(self._streams)

    # ---- requests -------------------------------------------------------------------------
    async def generate(self, request_id: str, prompt: PreparedPrompt | str | list[int],
                       params: SamplingParams, add_special_tokens: bool = True, mm_items=(),
                       mrope=None, delta: bool = True) -> AsyncIterator[RequestOutput]:
        """Yields outputs as tokens arrive (only the new part each time when ``delta``).
        Stopping the iteration (client gone) aborts the request. Prepare the prompt with
        ``self.engine.prepare`` / ``prepare_chat`` (in a worker thread when it has images)."""
        if self.dead is not None:
            raise EngineDeadError(f"the engine stopped: {self.dead!r}")
        if self.core.num_waiting >= self.max_waiting:
            raise QueueFullError(f"the server's queue is full ({self.max_waiting} waiting "
                                 "requests); retry later")
        if not isinstance(prompt, PreparedPrompt):
            prompt = PreparedPrompt(self.engine.input_processor.tokenize(prompt, add_special_tokens),
                                    prompt if isinstance(prompt, str) else None,
                                    list(mm_items), mrope)
        requests = self.engine.input_processor.make_requests(request_id, prompt, params)
        stream: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = stream
        self.engine.output_processor.add(request_id, prompt.text, requests, delta)
        self._inbox.put(_Add(requests))
        finished = False
        try:
            while True:
                item = await stream.get()
                if isinstance(item, BaseException):
                    raise EngineDeadError(f"the engine stopped: {item!r}") from item
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        child_ids = self.engine.output_processor.abort(request_id)
        if child_ids:
            self._inbox.put(_Abort(child_ids))

    # ---- the core thread ------------------------------------------------------------------
    def _core_loop(self) -> None:
        core = self.core
        try:
            while not self._stopping.is_set():
                block = not core.has_unfinished()
                self._drain_inbox(block)
                if not core.has_unfinished():
                    continue
                outputs = core.step()
                if outputs:
                    self._loop.call_soon_threadsafe(self._on_outputs, outputs)
        except BaseException as exc:  # surfaced to every waiting request
            logger.exception("engine core died")
            self.dead = exc
            self._loop.call_soon_threadsafe(self._fail_all, exc)

    def _drain_inbox(self, block: bool) -> None:
        while True:
            try:
                msg = self._inbox.get(block=block, timeout=0.5 if block else None)
            except queue.Empty:
                return
            block = False
            if msg is None:
                return
            if isinstance(msg, _Add):
                for r in msg.requests:
                    self.core.add_request(r)
            else:
                self.core.abort(msg.child_ids)

    # ---- back on the event loop -----------------------------------------------------------
    def _on_outputs(self, outputs) -> None:
        results, to_abort = self.engine.output_processor.process(outputs)
        if to_abort:
            self._inbox.put(_Abort(to_abort))
        for out in results:
            stream = self._streams.get(out.request_id)
            if stream is not None:
                stream.put_nowait(out)

    def _fail_all(self, exc: BaseException) -> None:
        for stream in self._streams.values():
            stream.put_nowait(exc)
