"""When a step fails: find the request that caused it, fail that one, keep serving the rest.

A step runs many requests at once, so its exception does not say whose it is. The requests of a
failed step become suspects, and each is run alone for one step (the others wait those few
steps): one that fails alone is failed with the error, the others go back to normal batching.
Out of memory is a failure of the step's size, not of a request: the encoder cache's entries
and the allocator's free blocks go back to the device, and a suspect that runs out of memory
alone is retried with its prefill chunk halved before it is failed (an image goes through the vision tower whole, so a
screenshot too large for the card still fails, and alone).

Errors after which the device cannot be trusted (a CUDA error other than out of memory: an
illegal address, a device-side assert) and a run of failures with no step succeeding between
them are fatal: the core stops, and its process exits non-zero so a supervisor restarts it.
"""
from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

import torch

from autoglm_serve.engine.core.request import Request
from autoglm_serve.engine.parallel.distributed import TensorParallelFailure
from autoglm_serve.outputs import RequestError

logger = logging.getLogger(__name__)

# Failed steps in a row, with no step succeeding between them, that mean the engine itself is
# broken rather than a request.
MAX_CONSECUTIVE_FAILURES = 16
# A suspect that runs out of memory is retried with halved prefill chunks down to this size.
MIN_RETRY_CHUNK = 16


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc))  # the CPU's


def is_fatal(exc: BaseException) -> bool:
    """An error no request could have caused alone, or one that leaves the device unusable."""
    if not isinstance(exc, Exception):
        return True                 # KeyboardInterrupt, SystemExit
    if isinstance(exc, TensorParallelFailure):
        return True                 # the ranks are out of lockstep
    if is_out_of_memory(exc):
        return False
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(exc, accelerator_error):
        return True
    text = str(exc)
    return "CUDA error" in text or "device-side assert" in text


class FaultIsolation:
    def __init__(self, max_chunk: int, release_memory: Callable[[], None]):
        """release_memory: gives what caches hold back to the device after an OOM."""
        self.max_chunk = max_chunk
        self.release_memory = release_memory
        self.suspects: deque[Request] = deque()
        self.chunk = max_chunk          # the next suspect's prefill chunk budget
        self.consecutive_failures = 0

    @property
    def isolating(self) -> bool:
        return bool(self.suspects)

    def step_failed(self, requests: list[Request], exc: BaseException, num_tokens: int
                    ) -> RequestError | None:
        """A step raised: its requests become suspects; a step of one request has failed
        alone (see suspect_failed). Raises when fatal."""
        if len(requests) == 1:
            self.suspects.appendleft(requests[0])
            return self.suspect_failed(exc, num_tokens)
        self._count_failure(exc)
        logger.warning("a step of %d requests failed (%s: %s): running them one at a time to "
                       "find the cause", len(requests), type(exc).__name__, exc)
        self.suspects.extend(requests)
        return None

    def next_suspect(self) -> Request | None:
        while self.suspects and self.suspects[0].status.finished:
            self._cleared()
        return self.suspects[0] if self.suspects else None

    def suspect_passed(self) -> None:
        """It ran a step alone. One that needed a smaller chunk stays alone, at that chunk,
        until its prompt is in: batched again at full size it would run out again."""
        self.consecutive_failures = 0
        request = self.suspects[0]
        if self.chunk < self.max_chunk and request.num_computed_tokens < request.num_prompt_tokens:
            return
        self._cleared()

    def suspect_failed(self, exc: BaseException, chunk_used: int) -> RequestError | None:
        """The suspect failed alone: the error to fail it with, or None when it is retried
        with a smaller chunk. Raises when fatal."""
        self._count_failure(exc)
        oom = is_out_of_memory(exc)
        if oom and chunk_used > MIN_RETRY_CHUNK:
            self.chunk = max(MIN_RETRY_CHUNK, chunk_used // 2)
            logger.warning("request %s ran out of memory alone with a %d-token chunk: retrying "
                           "with %d", self.suspects[0].request_id, chunk_used, self.chunk)
            return None
        request = self.suspects[0]
        self._cleared()
        logger.error("request %s failed: %s: %s", request.request_id, type(exc).__name__, exc)
        if oom:
            return RequestError("the server ran out of device memory for this request (a "
                                "smaller image, prompt or max_tokens may fit); retry later",
                                out_of_memory=True)
        return RequestError(f"the engine could not run this request ({type(exc).__name__}: "
                            f"{exc})")

    def steps_succeeded(self) -> None:
        self.consecutive_failures = 0

    def _cleared(self) -> None:
        self.suspects.popleft()
        self.chunk = self.max_chunk

    def _count_failure(self, exc: BaseException) -> None:
        if is_out_of_memory(exc):
            self.release_memory()
        self.consecutive_failures += 1
        if is_fatal(exc):
            raise exc
        if self.consecutive_failures > MAX_CONSECUTIVE_FAILURES:
            raise RuntimeError(f"{self.consecutive_failures} steps in a row failed; the last: "
                               f"{type(exc).__name__}: {exc}") from exc
