"""One request's outputs on their way to its consumer (an HTTP stream).

When the consumer falls behind (hundreds of streams on one event loop), the outputs that piled
up reach it as one: texts, token ids and logprobs joined, the latest finish reason. A lagging
stream so sends fewer, larger chunks instead of falling further behind, and what it sends adds
up to exactly what it would have sent one token at a time.
"""
from __future__ import annotations

import asyncio

from autoglm_serve.outputs import RequestOutput


class RequestOutputCollector:
    def __init__(self, delta: bool):
        """delta: outputs carry only what is new (streaming), so they are joined; otherwise
        each output holds everything so far and the latest replaces the others."""
        self.delta = delta
        self._pending: RequestOutput | BaseException | None = None
        self._ready = asyncio.Event()

    def put(self, item: RequestOutput | BaseException) -> None:
        pending = self._pending
        if pending is None or isinstance(item, BaseException):
            self._pending = item
        elif isinstance(pending, BaseException):
            return                      # the engine's error is the last word
        elif self.delta:
            merge_delta(pending, item)
        else:
            self._pending = item
        self._ready.set()

    async def get(self) -> RequestOutput | BaseException:
        """What arrived since the last call (waits for something); an exception is returned,
        not raised."""
        while self._pending is None:
            await self._ready.wait()
        item, self._pending = self._pending, None
        self._ready.clear()
        return item


def merge_delta(into: RequestOutput, new: RequestOutput) -> None:
    """Appends the delta output ``new`` to ``into`` (not yet handed out, so ours to change),
    as if the two had come as one."""
    for c in new.outputs:
        old = next((o for o in into.outputs if o.index == c.index), None)
        if old is None:
            into.outputs.append(c)
            continue
        old.text += c.text
        old.token_ids.extend(c.token_ids)
        if c.logprobs is not None:
            if old.logprobs is None:
                old.logprobs = c.logprobs
            else:
                old.logprobs.extend(c.logprobs)
        old.finish_reason, old.stop_reason = c.finish_reason, c.stop_reason
        old.cumulative_logprob = c.cumulative_logprob
    into.finished = new.finished
    into.metrics = new.metrics
    into.num_cached_tokens = new.num_cached_tokens
    into.num_preemptions = new.num_preemptions
