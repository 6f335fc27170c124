"""What chat and completions share: the model check, sampling settings, admission, tokenizing
off the event loop for long prompts, and the engine stream with its metrics and abort.

Admission counts what a request puts in the engine's queue, not requests: its sequences (n per
prompt) and their prompt tokens. A request larger than the whole queue is a 400 (it could never
run); one that does not fit now is a 503 with Retry-After, so one client's n=100000 or burst of
huge prompts cannot lock everybody else out.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from autoglm_serve.engine.async_llm import (AsyncLLM, EngineDeadError, QueueFullError,
                                            RequestFailedError)
from autoglm_serve.engine.frontend.input_processor import PreparedPrompt
from autoglm_serve.outputs import RequestOutput
from autoglm_serve.sampling_params import SamplingParams
from autoglm_serve.server.args import ServerSettings
from autoglm_serve.server.errors import OpenAIError, bad_request, model_not_found, sampling_error
from autoglm_serve.server.metrics import ServerMetrics
from autoglm_serve.server.protocol import _SamplingFields
from autoglm_serve.structured.spec import StructuredSpec

# Prompts longer than this (characters) are tokenized on a worker thread, so one large prompt
# does not stall every other stream on the event loop; short ones are cheaper inline.
THREAD_TOKENIZE_CHARS = 8192
_DEFAULTED = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
RETRY_AFTER_S = 1


class Serving:
    def __init__(self, engine: AsyncLLM, settings: ServerSettings, metrics: ServerMetrics):
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        self.tokenizer = engine.tokenizer
        self.max_model_len: int = engine.info.max_model_len
        self.served_names = settings.served_model_names
        self.defaults = {**(engine.frontend.generation_defaults
                            if settings.use_generation_config else {}),
                         **settings.generation_overrides}
        self.default_max_tokens: int | None = self.defaults.get("max_new_tokens")
        self.max_sequences = engine.info.max_num_seqs + settings.max_waiting_requests
        # phone agents queue far more prompt tokens than the KV cache holds (16 agents' growing
        # contexts: 200k tokens beside 54k of KV on a 24 GB card): the default bounds only a
        # flood, with room for the largest request n x max_model_len could make
        self.max_queued_tokens = settings.max_queued_tokens or max(
            16 * engine.info.kv_tokens, settings.max_n * self.max_model_len, 1 << 22)
        self.num_sequences = 0          # admitted and not yet finished: what the queue holds
        self.num_queued_tokens = 0

    def model_name(self, requested: str | None) -> str:
        if requested is None or requested == "":
            return self.served_names[0]
        if requested not in self.served_names:
            raise model_not_found(requested, self.served_names)
        return requested

    def sampling_params(self, req: _SamplingFields, *, max_tokens: int | None,
                        logprobs: int | None, renames: dict[str, str] | None = None,
                        structured: StructuredSpec | None = None,
                        prompt_logprobs: int | None = None) -> SamplingParams:
        """The request's fields over the model's generation_config.json defaults."""
        if req.n > self.settings.max_n:
            raise bad_request(f"n must be at most {self.settings.max_n} on this server "
                              f"(--max-n), got {req.n}", "n")
        values = {k: getattr(req, k) if getattr(req, k) is not None else self.defaults.get(k)
                  for k in _DEFAULTED}
        values = {k: v for k, v in values.items() if v is not None}
        for k in ("frequency_penalty", "presence_penalty"):
            if getattr(req, k) is not None:
                values[k] = getattr(req, k)
        try:
            return SamplingParams(
                n=req.n, seed=req.seed, stop=req.stop, stop_token_ids=req.stop_token_ids,
                max_tokens=max_tokens, min_tokens=req.min_tokens, ignore_eos=req.ignore_eos,
                logprobs=logprobs, skip_special_tokens=req.skip_special_tokens,
                spaces_between_special_tokens=req.spaces_between_special_tokens,
                include_stop_str_in_output=req.include_stop_str_in_output,
                logit_bias={int(k): float(v) for k, v in (req.logit_bias or {}).items()},
                structured=structured, prompt_logprobs=prompt_logprobs, **values)
        except (ValueError, TypeError) as exc:
            raise sampling_error(ValueError(str(exc)), renames) from exc

    def check_stream_options(self, req: _SamplingFields) -> None:
        if req.stream_options is not None and not req.stream:
            raise bad_request("stream_options is only allowed when stream is true",
                              "stream_options")

    def admit(self, num_sequences: int, num_tokens: int) -> Admission:
        """Reserves queue room for a request's sequences and prompt tokens (released when its
        streams close), or refuses it."""
        if self.engine.dead is not None:
            raise OpenAIError(503, "the engine has stopped; the server must be restarted")
        if num_tokens > self.max_queued_tokens:
            raise bad_request(f"this request puts {num_tokens} prompt tokens in the queue "
                              f"(n x the prompts), over the server's limit of "
                              f"{self.max_queued_tokens} (--max-queued-tokens)", "n")
        if num_sequences > self.max_sequences:
            raise bad_request(f"this request asks for {num_sequences} sequences, over the "
                              f"server's limit of {self.max_sequences} (--max-num-seqs + "
                              "--max-waiting-requests)", "n")
        if self.num_sequences + num_sequences > self.max_sequences \
                or self.num_queued_tokens + num_tokens > self.max_queued_tokens:
            raise OpenAIError(503, f"the server is at capacity ({self.num_sequences} sequences, "
                              f"{self.num_queued_tokens} prompt tokens in flight); retry later",
                              code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)})
        self.num_sequences += num_sequences
        self.num_queued_tokens += num_tokens
        return Admission(self, num_sequences, num_tokens)

    async def tokenize(self, text: str, add_special_tokens: bool) -> list[int]:
        if len(text) > THREAD_TOKENIZE_CHARS:
            return await asyncio.to_thread(self.tokenizer.encode, text,
                                           add_special_tokens=add_special_tokens)
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def check_length(self, token_ids: list[int], param: str,
                     max_tokens: tuple[str, int] | None = None) -> None:
        """The engine's own prompt check (InputProcessor.validate) as a 400, then the HTTP
        API's: max_tokens, the (field, value) the client asked for, must fit beside the prompt
        (as vLLM answers); a server default is clamped to the room left instead."""
        try:
            self.engine.frontend.input_processor.validate(token_ids)
        except ValueError as exc:
            raise bad_request(str(exc), param) from exc
        if max_tokens is not None and len(token_ids) + max_tokens[1] > self.max_model_len:
            field, value = max_tokens
            raise bad_request(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {len(token_ids) + value} tokens ({len(token_ids)} in the prompt, "
                f"{value} in the completion). Reduce the prompt or {field}.", field)

    async def start(self, request_id: str, prompt: PreparedPrompt, params: SamplingParams,
                    param: str, admission: Admission) -> RequestStream:
        """Adds the request and waits for its first output, so that every engine refusal
        becomes an HTTP status before a response (or a stream) begins. The stream holds a
        share of the admission, given back when it closes."""
        gen = self.engine.generate(request_id, prompt, params)
        try:
            first = await gen.__anext__()
        except QueueFullError as exc:
            raise OpenAIError(503, str(exc), code="queue_full") from exc
        except (EngineDeadError, RequestFailedError) as exc:
            raise stream_error(exc) from exc
        except ValueError as exc:
            raise bad_request(str(exc), param) from exc
        n_tokens = len(prompt.token_ids)
        share = admission.share(params.n, params.n * n_tokens)
        return RequestStream(gen, first, self.metrics, n_tokens, share)


def stream_error(exc: EngineDeadError | RequestFailedError | OpenAIError) -> OpenAIError:
    """What the client is told when the engine fails its request, before or during a stream:
    out of memory (the same request may fit later) and a stopped engine are 503, another
    failure of this request 500."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, RequestFailedError):
        if exc.error.out_of_memory:
            return OpenAIError(503, exc.error.message, code="out_of_memory",
                               headers={"Retry-After": str(RETRY_AFTER_S)})
        return OpenAIError(500, exc.error.message, code="request_failed")
    return OpenAIError(503, str(exc))


@dataclass
class Admission:
    """A request's reserved queue room (Serving.admit counts it in); each of its streams takes
    a share and gives it back on close, and what no stream took is given back by ``release``
    (a refusal midway)."""
    serving: Serving
    num_sequences: int
    num_tokens: int

    def share(self, num_sequences: int, num_tokens: int) -> Admission:
        self.num_sequences -= num_sequences
        self.num_tokens -= num_tokens
        return Admission(self.serving, num_sequences, num_tokens)

    def release(self) -> None:
        self.serving.num_sequences -= self.num_sequences
        self.serving.num_queued_tokens -= self.num_tokens
        self.num_sequences = self.num_tokens = 0


class RequestStream:
    """The engine's outputs for one request; records metrics and aborts if left early."""

    def __init__(self, gen: AsyncIterator[RequestOutput], first: RequestOutput,
                 metrics: ServerMetrics, num_prompt_tokens: int, admission: Admission):
        self.gen = gen
        self.first: RequestOutput | None = first
        self.metrics = metrics
        self.admission = admission
        self.num_prompt_tokens = num_prompt_tokens
        self.prompt_token_ids = first.prompt_token_ids
        self.prompt_logprobs = first.prompt_logprobs   # asked for: from the first output on
        self.num_output_tokens = 0
        self.finish_reason: str | None = None
        self._last = time.monotonic()
        self._closed = False

    def __aiter__(self):
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestOutput]:
        try:
            if self.first is not None:
                out, self.first = self.first, None
                self._account(out)
                yield out
                if out.finished:
                    return
            async for out in self.gen:
                self._account(out)
                yield out
        finally:
            await self.close()

    def _account(self, out: RequestOutput) -> None:
        now = time.monotonic()
        new = sum(len(c.token_ids) for c in out.outputs)
        if new and self.num_output_tokens:
            self.metrics.observe_token_gap((now - self._last) / new)
        self._last = now
        self.num_output_tokens += new
        if out.finished:
            reasons = [c.finish_reason for c in out.outputs if c.finish_reason]
            self.finish_reason = reasons[-1] if reasons else "stop"
            self.metrics.observe_finished(out.metrics, self.num_prompt_tokens,
                                          self.num_output_tokens, self.finish_reason)

    async def close(self) -> None:
        """Aborts the request in the engine if it has not finished (client gone, error)."""
        if self._closed:
            return
        self._closed = True
        self.admission.release()
        await self.gen.aclose()
        if self.finish_reason is None:
            self.finish_reason = "abort"
            self.metrics.observe_aborted()
