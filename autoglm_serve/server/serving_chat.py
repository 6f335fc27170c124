"""POST /v1/chat/completions: messages → template → engine → OpenAI response or SSE stream."""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

from autoglm_serve.engine.async_llm import EngineDeadError, RequestFailedError
from autoglm_serve.engine.frontend.chat_template import PromptError
from autoglm_serve.multimodal.media import MediaError
from autoglm_serve.outputs import Logprob
from autoglm_serve.server.errors import OpenAIError, bad_request
from autoglm_serve.server.protocol import (ChatChoice, ChatCompletionRequest,
                                           ChatCompletionResponse, ChatLogprobs,
                                           PromptTokensDetails, ResponseMessage, TokenLogprob,
                                           TopLogprob, Usage, random_id)
from autoglm_serve.server.reasoning import (ReasoningSplitter, prompt_opens_thinking,
                                            split_reasoning)
from autoglm_serve.server.serving import (THREAD_TOKENIZE_CHARS, RequestStream, Serving,
                                          stream_error)
from autoglm_serve.server.structured_request import structured_spec
from autoglm_serve.server.tool_parsers import ToolCall
from autoglm_serve.server.tools import ToolMode, tool_mode
from autoglm_serve.structured.action_grammar import parse_action
from autoglm_serve.structured.spec import StructuredSpec


def chat_logprobs(entries: list[dict[int, Logprob]], token_ids: list[int], top_n: int
                  ) -> list[dict]:
    """Engine logprobs → OpenAI's `logprobs.content` items."""
    items = []
    for tid, entry in zip(token_ids, entries):
        sampled = entry[tid]
        tops = sorted((lp for lp in entry.values() if lp.rank <= top_n), key=lambda lp: lp.rank)
        token = sampled.decoded_token or ""
        items.append({"token": token, "logprob": sampled.logprob,
                      "bytes": list(token.encode("utf-8")),
                      "top_logprobs": [{"token": t.decoded_token or "", "logprob": t.logprob,
                                        "bytes": list((t.decoded_token or "").encode("utf-8"))}
                                       for t in tops[:top_n]]})
    return items


class ChatHandler:
    def __init__(self, serving: Serving):
        self.s = serving

    async def create(self, req: ChatCompletionRequest):
        s = self.s
        model = s.model_name(req.model)
        s.check_stream_options(req)
        if req.top_logprobs is not None and not req.logprobs:
            raise bad_request("top_logprobs requires logprobs to be true", "top_logprobs")
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None \
            else req.max_tokens if req.max_tokens is not None else s.default_max_tokens
        renames = {"max_tokens": "max_completion_tokens"} \
            if req.max_completion_tokens is not None else {}
        renames["logprobs"] = "top_logprobs"
        tools = tool_mode(req, s.settings)
        spec = structured_spec(req)
        if tools.spec is not None:
            if spec is not None:
                raise bad_request(f"tool_choice {tools.kind!r} cannot be combined with a "
                                  "structured output", "tool_choice")
            spec = tools.spec
        elif spec is None and tools.kind == "none" and s.settings.default_structured_grammar:
            spec = StructuredSpec(s.settings.default_structured_grammar)
        params = s.sampling_params(req, max_tokens=max_tokens,
                                   logprobs=(req.top_logprobs or 0) if req.logprobs else None,
                                   renames=renames, structured=spec)
        wants_action = spec is not None and spec.kind == "autoglm_action"
        if req.chat_template is not None and not s.settings.trust_request_chat_template:
            # a template is code the event loop runs: two nested range(100000) loops in a
            # 180-byte body held every other stream for minutes (vLLM refuses it too)
            raise bad_request("a request's chat_template is refused unless the server runs "
                              "with --trust-request-chat-template", "chat_template")
        kwargs = dict(req.chat_template_kwargs or {})
        if req.enable_thinking is not None:
            kwargs.setdefault("enable_thinking", req.enable_thinking)
        frontend = s.engine.frontend
        try:
            rendered = frontend.render_chat(
                [m.model_dump(exclude_none=True) for m in req.messages],
                chat_template=req.chat_template, template_kwargs=kwargs,
                add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message,
                tools=[t.model_dump(exclude_none=True) for t in req.tools]
                if req.tools else None)
            # images are fetched, decoded and hashed, long prompts tokenized, on a worker
            # thread: never on the event loop that feeds the other streams
            prompt = await asyncio.to_thread(frontend.prepare_rendered, rendered) \
                if rendered.images or len(rendered.prompt) > THREAD_TOKENIZE_CHARS \
                else frontend.prepare_rendered(rendered)
        except PromptError as exc:
            raise bad_request(str(exc), exc.param) from exc
        except MediaError as exc:
            raise bad_request(str(exc), "messages") from exc
        token_ids = prompt.token_ids
        asked = ("max_completion_tokens", req.max_completion_tokens) \
            if req.max_completion_tokens is not None \
            else ("max_tokens", req.max_tokens) if req.max_tokens is not None else None
        s.check_length(token_ids, "messages", asked)
        split = req.return_reasoning if req.return_reasoning is not None \
            else s.settings.reasoning_parser is not None
        in_reasoning = split and prompt_opens_thinking(rendered.prompt)
        request_id = random_id("chatcmpl")
        admission = s.admit(params.n, params.n * len(token_ids))
        try:
            stream = await s.start(request_id, prompt, params, "messages", admission)
        finally:
            admission.release()     # what the stream did not take: nothing, or all on failure
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return self._sse(stream, request_id, model, params.n, split, in_reasoning,
                             req.top_logprobs or 0 if req.logprobs else None, include_usage,
                             tools, wants_action)
        try:
            return await self._collect(stream, request_id, model, params.n, split, in_reasoning,
                                       req.top_logprobs or 0 if req.logprobs else None,
                                       tools, wants_action)
        except (EngineDeadError, RequestFailedError) as exc:
            raise stream_error(exc) from exc

    async def _collect(self, stream: RequestStream, request_id: str, model: str, n: int,
                       split: bool, in_reasoning: bool, top_n: int | None,
                       tools: ToolMode, wants_action: bool) -> ChatCompletionResponse:
        texts = [[] for _ in range(n)]
        counts = [0] * n
        logprobs: list[list[dict]] = [[] for _ in range(n)]
        finish = [None] * n
        stop_reasons = [None] * n
        cached = 0
        async for out in stream:
            cached = out.num_cached_tokens
            for c in out.outputs:
                texts[c.index].append(c.text)
                counts[c.index] += len(c.token_ids)
                if top_n is not None and c.logprobs:
                    logprobs[c.index].extend(chat_logprobs(c.logprobs, c.token_ids, top_n))
                if c.finish_reason:
                    finish[c.index], stop_reasons[c.index] = c.finish_reason, c.stop_reason
        choices = []
        for i in range(n):
            raw = text = "".join(texts[i])
            reasoning = None
            if split:
                reasoning, text = split_reasoning(text, in_reasoning)
            content, calls = tools.calls(text)
            if calls and tools.kind in ("auto", "required") and finish[i] == "stop":
                finish[i] = "tool_calls"
            message = ResponseMessage(
                content=content, reasoning_content=reasoning,
                tool_calls=[c.to_openai() for c in calls],
                action=parse_action(raw) if wants_action else None)
            choices.append(ChatChoice(
                index=i, message=message,
                logprobs=ChatLogprobs(content=[TokenLogprob(
                    top_logprobs=[TopLogprob(**t) for t in item.pop("top_logprobs")], **item)
                    for item in logprobs[i]]) if top_n is not None else None,
                finish_reason=finish[i], stop_reason=stop_reasons[i]))
        prompt = stream.num_prompt_tokens
        usage = Usage(prompt_tokens=prompt, completion_tokens=sum(counts),
                      total_tokens=prompt + sum(counts),
                      prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))
        return ChatCompletionResponse(id=request_id, model=model, choices=choices, usage=usage)

    async def _sse(self, stream: RequestStream, request_id: str, model: str, n: int,
                   split: bool, in_reasoning: bool, top_n: int | None, include_usage: bool,
                   tools: ToolMode, wants_action: bool) -> AsyncIterator[str]:
        created = int(time.time())
        head = {"id": request_id, "object": "chat.completion.chunk", "created": created,
                "model": model}
        if include_usage:
            head["usage"] = None

        def chunk(index: int, delta: dict, finish_reason=None, logprobs=None, **extra) -> str:
            choice = {"index": index, "delta": delta, "logprobs": logprobs,
                      "finish_reason": finish_reason, **extra}
            return f"data: {json.dumps({**head, 'choices': [choice]}, ensure_ascii=False)}\n\n"

        splitters = [ReasoningSplitter(in_reasoning) for _ in range(n)] if split else None
        streams = [_ToolStream(tools) for _ in range(n)]
        raw = [[] for _ in range(n)]
        completion_tokens = cached = 0
        try:
            for i in range(n):
                yield chunk(i, {"role": "assistant", "content": ""})
            async for out in stream:
                cached = out.num_cached_tokens
                for c in out.outputs:
                    completion_tokens += len(c.token_ids)
                    delta: dict = {}
                    if splitters is not None:
                        reasoning, content = splitters[c.index].feed(c.text, c.finished)
                        if reasoning:
                            delta["reasoning_content"] = reasoning
                        if content:
                            delta["content"] = content
                    elif c.text:
                        delta["content"] = c.text
                    raw[c.index].append(c.text)
                    if "content" in delta:
                        delta.update(streams[c.index].feed(delta.pop("content")))
                    finish_reason = c.finish_reason
                    if finish_reason:
                        delta.update(streams[c.index].finish())
                        if streams[c.index].called and tools.kind in ("auto", "required") \
                                and finish_reason == "stop":
                            finish_reason = "tool_calls"
                        if wants_action:
                            delta["action"] = parse_action("".join(raw[c.index]))
                    lp = None
                    if top_n is not None and c.logprobs:
                        lp = {"content": chat_logprobs(c.logprobs, c.token_ids, top_n)}
                    if delta or lp:
                        yield chunk(c.index, delta, logprobs=lp)
                    if finish_reason:
                        yield chunk(c.index, {}, finish_reason, stop_reason=c.stop_reason)
            if include_usage:
                prompt = stream.num_prompt_tokens
                usage = {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                         "total_tokens": prompt + completion_tokens,
                         "prompt_tokens_details": {"cached_tokens": cached}}
                yield f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
        except (OpenAIError, EngineDeadError, RequestFailedError) as exc:  # after the stream began: say so in-stream
            yield stream_error(exc).sse()
            yield "data: [DONE]\n\n"
        finally:
            await stream.close()


class _ToolStream:
    """One choice's content deltas under a tool mode: passed on as they come (no tools), as
    argument fragments of one call (a named function), held until the end and sent as whole
    calls (required: the reply is one JSON list), or passed on up to where the family's
    tool-call marker begins, the rest held until the end decides (auto)."""

    def __init__(self, mode: ToolMode):
        self.mode = mode
        self.text = ""          # all content so far
        self.sent = 0           # how much of it went out as content
        self.called = False

    def feed(self, text: str) -> dict:
        kind = self.mode.kind
        if kind == "none":
            return {"content": text}
        if kind == "named":
            if not self.called:     # the first fragment opens the call: id, type, name
                self.called = True
                return {"tool_calls": [ToolCall(self.mode.name, text).to_openai(0)]}
            return {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}
        self.text += text
        if kind == "auto":
            marker = self.mode.parser.start_marker
            at = self.text.find(marker, self.sent)
            end = at if at >= 0 else len(self.text) - _partial_suffix(self.text, marker)
            if at < 0 and end > self.sent:
                out, self.sent = self.text[self.sent:end], end
                return {"content": out}
        return {}

    def finish(self) -> dict:
        if self.mode.kind in ("none", "named"):
            return {}
        content, calls = self.mode.calls(self.text)
        out: dict = {}
        if calls:
            self.called = True
            out["tool_calls"] = [c.to_openai(i) for i, c in enumerate(calls)]
            rest = (content or "")[self.sent:] if (content or "").startswith(
                self.text[:self.sent]) else ""
        else:
            rest = self.text[self.sent:]
        if rest.strip():
            out["content"] = rest
        return out


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of text that could begin marker (held back)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0
