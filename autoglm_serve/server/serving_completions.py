"""POST /v1/completions: prompt(s) → engine → OpenAI text_completion response or SSE stream."""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

from autoglm_serve.engine.async_llm import EngineDeadError, RequestFailedError
from autoglm_serve.engine.frontend.input_processor import PreparedPrompt
from autoglm_serve.outputs import Logprob, RequestOutput
from autoglm_serve.server.errors import OpenAIError, bad_request
from autoglm_serve.server.protocol import (CompletionChoice, CompletionLogprobs,
                                           CompletionRequest, CompletionResponse, Usage,
                                           random_id)
from autoglm_serve.server.serving import RequestStream, Serving, stream_error
from autoglm_serve.server.structured_request import structured_spec


def completion_logprobs(entries: list[dict[int, Logprob] | None], token_ids: list[int],
                        top_n: int, offset: int, decode=None) -> CompletionLogprobs:
    """entries: per token; None (the prompt's first token, echoed) has no logprob."""
    out = CompletionLogprobs()
    for tid, entry in zip(token_ids, entries):
        if entry is None:
            token = decode(tid) if decode is not None else ""
            out.tokens.append(token)
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            out.text_offset.append(offset)
            offset += len(token)
            continue
        sampled = entry[tid]
        token = sampled.decoded_token or ""
        out.tokens.append(token)
        out.token_logprobs.append(sampled.logprob)
        out.top_logprobs.append({(lp.decoded_token or ""): lp.logprob for lp in
                                 sorted(entry.values(), key=lambda lp: lp.rank)
                                 if lp.rank <= top_n} if top_n else None)
        out.text_offset.append(offset)
        offset += len(token)
    return out


async def _merge(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Outputs of several prompts' requests as they come, tagged with the prompt's index."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: RequestStream) -> None:
        try:
            async for out in stream:
                await queue.put((i, out))
        except BaseException as exc:
            await queue.put((i, exc))
            raise
        finally:
            await queue.put((i, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        # The pumps must be done before their engine generators can be closed.
        await asyncio.gather(*tasks, return_exceptions=True)
        for s in streams:
            await s.close()


class CompletionHandler:
    def __init__(self, serving: Serving):
        self.s = serving

    async def _prompts(self, req: CompletionRequest, max_tokens: tuple[str, int] | None
                       ) -> list[list[int]]:
        p = req.prompt
        if isinstance(p, str):
            items: list = [p]
        elif not p:
            raise bad_request("prompt must not be empty", "prompt")
        elif isinstance(p[0], int):
            items = [p]
        else:
            items = list(p)
        ids = []
        for item in items:
            tokens = await self.s.tokenize(item, req.add_special_tokens) \
                if isinstance(item, str) else list(item)
            self.s.check_length(tokens, "prompt", max_tokens)
            ids.append(tokens)
        return ids

    async def create(self, req: CompletionRequest):
        s = self.s
        model = s.model_name(req.model)
        s.check_stream_options(req)
        if req.best_of is not None and req.best_of != req.n:
            raise bad_request(f"best_of must equal n ({req.n}): choosing the best of several "
                              "sequences is not supported", "best_of")
        # The legacy endpoint's default is 16 tokens (OpenAI, vLLM), unless the server says.
        default = s.default_max_tokens or 16
        params = s.sampling_params(req, max_tokens=req.max_tokens if "max_tokens" in
                                   req.model_fields_set else default, logprobs=req.logprobs,
                                   structured=structured_spec(req),
                                   prompt_logprobs=req.logprobs if req.echo else None)
        explicit = "max_tokens" in req.model_fields_set and req.max_tokens is not None
        prompts = await self._prompts(req, ("max_tokens", req.max_tokens) if explicit else None)
        # echo: each choice's text starts with its prompt's
        echoes = [self._prompt_text(req, i, ids) if req.echo else ""
                  for i, ids in enumerate(prompts)]
        request_id = random_id("cmpl")
        streams: list[RequestStream] = []
        admission = s.admit(params.n * len(prompts), params.n * sum(map(len, prompts)))
        try:
            for i, ids in enumerate(prompts):
                rid = request_id if len(prompts) == 1 else f"{request_id}-{i}"
                streams.append(await s.start(rid, PreparedPrompt(ids), params, "prompt",
                                             admission))
        except BaseException:
            for st in streams:
                await st.close()
            raise
        finally:
            admission.release()
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return self._sse(streams, request_id, model, params.n, req.logprobs, include_usage,
                             echoes)
        try:
            return await self._collect(streams, request_id, model, params.n, req.logprobs,
                                       echoes)
        except (EngineDeadError, RequestFailedError) as exc:
            raise stream_error(exc) from exc

    def _prompt_text(self, req: CompletionRequest, index: int, ids: list[int]) -> str:
        p = req.prompt
        items = [p] if isinstance(p, str) or (p and isinstance(p[0], int)) else list(p)
        if isinstance(items[index], str):
            return items[index]
        return self.s.tokenizer.decode(ids) if self.s.tokenizer is not None else ""

    def _logprobs(self, stream: RequestStream, echo: str, entries, token_ids, top_n: int
                  ) -> CompletionLogprobs:
        """The completion's logprobs, after the prompt's when it is echoed."""
        if not echo:
            return completion_logprobs(entries, token_ids, top_n, 0)
        prompt_ids = stream.prompt_token_ids
        decode = lambda t: self.s.tokenizer.decode([t])   # noqa: E731
        out = completion_logprobs(stream.prompt_logprobs or [], prompt_ids, top_n, 0, decode)
        rest = completion_logprobs(entries, token_ids, top_n, len(echo))
        for name in ("text_offset", "token_logprobs", "tokens", "top_logprobs"):
            getattr(out, name).extend(getattr(rest, name))
        return out

    async def _collect(self, streams: list[RequestStream], request_id: str, model: str, n: int,
                       top_n: int | None, echoes: list[str]) -> CompletionResponse:
        total = len(streams) * n
        texts = [[] for _ in range(total)]
        token_ids: list[list[int]] = [[] for _ in range(total)]
        lps: list[list] = [[] for _ in range(total)]
        finish: list = [None] * total
        stop_reasons: list = [None] * total
        async for p, out in _merge(streams):
            for c in out.outputs:
                k = p * n + c.index
                texts[k].append(c.text)
                token_ids[k].extend(c.token_ids)
                if c.logprobs:
                    lps[k].extend(c.logprobs)
                if c.finish_reason:
                    finish[k], stop_reasons[k] = c.finish_reason, c.stop_reason
        choices = [CompletionChoice(
            index=k, text=echoes[k // n] + "".join(texts[k]), finish_reason=finish[k],
            stop_reason=stop_reasons[k],
            logprobs=self._logprobs(streams[k // n], echoes[k // n], lps[k], token_ids[k], top_n)
            if top_n is not None else None) for k in range(total)]
        prompt = sum(st.num_prompt_tokens for st in streams)
        completion = sum(len(t) for t in token_ids)
        return CompletionResponse(id=request_id, model=model, choices=choices,
                                  usage=Usage(prompt_tokens=prompt, completion_tokens=completion,
                                              total_tokens=prompt + completion))

    async def _sse(self, streams: list[RequestStream], request_id: str, model: str, n: int,
                   top_n: int | None, include_usage: bool, echoes: list[str]
                   ) -> AsyncIterator[str]:
        head = {"id": request_id, "object": "text_completion", "created": int(time.time()),
                "model": model}
        if include_usage:
            head["usage"] = None
        offsets = [0] * (len(streams) * n)
        completion_tokens = 0
        try:
            for k in range(len(streams) * n):
                if echoes[k // n]:
                    lp = self._logprobs(streams[k // n], echoes[k // n], [], [], top_n) \
                        .model_dump() if top_n is not None else None
                    offsets[k] = len(echoes[k // n])
                    choice = {"index": k, "text": echoes[k // n], "logprobs": lp,
                              "finish_reason": None, "stop_reason": None}
                    yield f"data: {json.dumps({**head, 'choices': [choice]}, ensure_ascii=False)}\n\n"

            async for p, out in _merge(streams):
                for c in out.outputs:
                    k = p * n + c.index
                    completion_tokens += len(c.token_ids)
                    lp = None
                    if top_n is not None and c.logprobs:
                        lp = completion_logprobs(c.logprobs, c.token_ids, top_n,
                                                 offsets[k]).model_dump()
                    offsets[k] += len(c.text)
                    if not (c.text or lp or c.finish_reason):
                        continue
                    choice = {"index": k, "text": c.text, "logprobs": lp,
                              "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
                    body = {**head, "choices": [choice]}
                    yield f"data: {json.dumps(body, ensure_ascii=False)}\n\n"
            if include_usage:
                prompt = sum(st.num_prompt_tokens for st in streams)
                usage = {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                         "total_tokens": prompt + completion_tokens}
                yield f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
        except (OpenAIError, EngineDeadError, RequestFailedError) as exc:
            yield stream_error(exc).sse()
            yield "data: [DONE]\n\n"
        finally:
            for st in streams:
                await st.close()
