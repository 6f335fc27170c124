"""Requests waiting for their grammar, compiled on a worker thread.

A grammar compiles once per distinct spec (structured/backend.py), in milliseconds for common
schemas but up to seconds for a large one, and the first one also builds the vocabulary's
tables: done on the engine loop, that would stall every running stream. So a request whose
grammar is not compiled yet waits here (not in the scheduler) until it is; one whose grammar
is cached gets its matcher at once.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from autoglm_serve.engine.core.request import Request


class PendingGrammars:
    def __init__(self, make_backend: Callable[[], object]):
        self._make_backend = make_backend
        self._backend = None
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self.waiting: dict[str, tuple[Request, Future]] = {}

    def backend(self):
        with self._lock:
            if self._backend is None:
                self._backend = self._make_backend()
            return self._backend

    def add(self, req: Request) -> bool:
        """True when req got its matcher at once; else it waits here for ready()."""
        spec = req.sampling_params.structured
        if self._backend is not None and self._backend.is_cached(spec):
            req.grammar = self._backend.matcher(spec, req.stop_ids)
            return True
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
        future = self._pool.submit(lambda: self.backend().matcher(spec, req.stop_ids))
        self.waiting[req.request_id] = (req, future)
        return False

    def ready(self) -> list[tuple[Request, BaseException | None]]:
        """The requests whose compile ended since the last call, with its error if it failed."""
        done = [rid for rid, (_, f) in self.waiting.items() if f.done()]
        out = []
        for rid in done:
            req, future = self.waiting.pop(rid)
            error = future.exception()
            if error is None:
                req.grammar = future.result()
            out.append((req, error))
        return out

    def wait(self, timeout: float) -> None:
        """Sleeps until a compile ends or timeout passes (the loop has nothing else to run)."""
        if self.waiting:
            wait([f for _, f in self.waiting.values()], timeout, FIRST_COMPLETED)

    def discard(self, request_id: str) -> bool:
        return self.waiting.pop(request_id, None) is not None

    def __bool__(self) -> bool:
        return bool(self.waiting)
