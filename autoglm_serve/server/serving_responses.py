"""POST /v1/responses: OpenAI's Responses API as vLLM serves it, without stored state.

The request becomes a chat completion request (instructions as the system message, input items
as messages, `reasoning` as the template's enable_thinking, `text.format` as response_format,
flat function tools as chat tools) that the chat handler generates; its response, or its
stream of chunks, is reshaped into a Response object, or into the Responses API's typed events
(response.created ... output_text.delta ... response.completed). LangChain's ChatOpenAI takes
this API whenever a request asks for `reasoning`. The thinking comes as the reasoning item's
text, or, where the request asks for a summary (`reasoning.summary`, what LangChain shows), as
its summary: the thinking as written, there being no summarizer.
"""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi.responses import JSONResponse
from pydantic import ValidationError

from autoglm_serve.server.errors import bad_request
from autoglm_serve.server.protocol import (ChatCompletionRequest, ChatCompletionResponse,
                                           ResponsesFunctionCallItem,
                                           ResponsesFunctionOutputItem, ResponsesImage,
                                           ResponsesMessageItem, ResponsesRequest)
from autoglm_serve.server.serving import Serving
from autoglm_serve.server.serving_chat import ChatHandler

# the chat endpoint's fields that vLLM's Responses endpoint takes too, as extras
_CHAT_EXTRAS = ("top_k", "min_p", "frequency_penalty", "presence_penalty",
                "repetition_penalty", "seed", "stop", "stop_token_ids", "min_tokens",
                "ignore_eos", "logit_bias", "chat_template_kwargs", "enable_thinking",
                "return_reasoning", "structured_outputs", "skip_special_tokens")


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponsesHandler:
    def __init__(self, serving: Serving, chat: ChatHandler):
        self.s, self.chat = serving, chat

    async def create(self, req: ResponsesRequest):
        if req.previous_response_id is not None:
            raise bad_request("previous_response_id is not supported: this server stores no "
                              "responses; send the conversation as input", "previous_response_id")
        chat_req = self._chat_request(req)
        result = await self.chat.create(chat_req)
        shell = self._shell(req, chat_req.model)
        if isinstance(result, ChatCompletionResponse):
            return JSONResponse(self._completed(shell, result))
        return self._events(shell, result)

    # ---- the request ----------------------------------------------------------------------
    def _chat_request(self, req: ResponsesRequest) -> ChatCompletionRequest:
        messages = [{"role": "system", "content": req.instructions}] if req.instructions else []
        messages += [{"role": "user", "content": req.input}] if isinstance(req.input, str) \
            else _messages(req.input)
        body = {k: v for k, v in (req.model_extra or {}).items() if k in _CHAT_EXTRAS}
        body.update(model=req.model, messages=messages, stream=req.stream,
                    max_tokens=req.max_output_tokens, temperature=req.temperature,
                    top_p=req.top_p, parallel_tool_calls=req.parallel_tool_calls)
        if req.stream:
            body["stream_options"] = {"include_usage": True}
        if req.reasoning is not None and req.reasoning.effort is not None:
            body.setdefault("enable_thinking", req.reasoning.effort != "none")
        if req.tools:
            body["tools"] = [{"type": "function", "function": t.model_dump(
                exclude={"type"}, exclude_none=True)} for t in req.tools]
        if req.tool_choice is not None:
            body["tool_choice"] = req.tool_choice if isinstance(req.tool_choice, str) else \
                {"type": "function", "function": {"name": req.tool_choice.name}}
        fmt = req.text.format if req.text is not None else None
        if fmt is not None and fmt.type == "json_object":
            body["response_format"] = {"type": "json_object"}
        elif fmt is not None and fmt.type == "json_schema":
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": fmt.name or "response", "schema": fmt.schema_, "strict": fmt.strict,
                "description": fmt.description}}
        try:
            return ChatCompletionRequest.model_validate(
                {k: v for k, v in body.items() if v is not None})
        except ValidationError as exc:
            err = exc.errors()[0]
            param = ".".join(str(p) for p in err["loc"]) or None
            raise bad_request(f"{param}: {err['msg']}" if param else err["msg"], param) from None

    # ---- the response ---------------------------------------------------------------------
    def _shell(self, req: ResponsesRequest, model: str | None) -> dict:
        """The Response object's fields that echo the request."""
        fmt = req.text.format if req.text is not None and req.text.format is not None else None
        return {
            "id": _item_id("resp"), "object": "response", "created_at": int(time.time()),
            "status": "in_progress", "error": None, "incomplete_details": None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "model": self.s.model_name(model), "output": [],
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": None,
            "reasoning": req.reasoning.model_dump() if req.reasoning else None,
            "store": False, "temperature": req.temperature, "top_p": req.top_p,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True)
                     if fmt else {"type": "text"}},
            "tool_choice": req.tool_choice if isinstance(req.tool_choice, str) or
            req.tool_choice is None else req.tool_choice.model_dump(),
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
            "truncation": "disabled", "usage": None, "user": req.user,
            "metadata": req.metadata or {}}

    def _usage(self, prompt: int, cached: int, completion: int, reasoning: str) -> dict:
        # the reasoning's tokens counted again from its text (the stream does not tag tokens)
        tokenizer = self.s.engine.frontend.tokenizer
        thought = len(tokenizer.encode(reasoning, add_special_tokens=False)) \
            if reasoning and tokenizer is not None else 0
        return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": completion,
                "output_tokens_details": {"reasoning_tokens": min(thought, completion)},
                "total_tokens": prompt + completion}

    def _completed(self, shell: dict, result: ChatCompletionResponse) -> dict:
        choice = result.choices[0]
        message = choice.message
        output = []
        if message.reasoning_content:
            output.append(_reasoning_item(_item_id("rs"), message.reasoning_content,
                                          _wants_summary(shell)))
        if message.content or not (message.tool_calls or message.reasoning_content):
            output.append(_message_item(_item_id("msg"), message.content or ""))
        for call in message.tool_calls:
            output.append(_call_item(_item_id("fc"), call.id, call.function.name,
                                     call.function.arguments))
        details = result.usage.prompt_tokens_details
        return {**shell, **_ending(choice.finish_reason), "output": output,
                "usage": self._usage(result.usage.prompt_tokens,
                                     details.cached_tokens if details else 0,
                                     result.usage.completion_tokens,
                                     message.reasoning_content or "")}

    async def _events(self, shell: dict, chunks: AsyncIterator[str]) -> AsyncIterator[str]:
        events = _EventWriter(shell, _wants_summary(shell))
        finish, usage = None, None
        try:
            # the chat stream started first (its role chunk comes at once): a client gone at
            # the first event then closes it, and that aborts the request
            first = await chunks.__anext__()
            yield events.emit("response.created", response=shell)
            yield events.emit("response.in_progress", response=shell)
            async for sse in _prepend(first, chunks):
                if not sse.startswith("data: {"):
                    continue             # [DONE]
                chunk = json.loads(sse[6:])
                if "error" in chunk:
                    yield events.emit("response.failed", response={
                        **shell, "status": "failed", "output": events.output,
                        "error": {"code": chunk["error"]["code"] or chunk["error"]["type"],
                                  "message": chunk["error"]["message"]}})
                    return
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk["choices"]:
                    delta = choice["delta"]
                    for text in events.reasoning(delta.get("reasoning_content")):
                        yield text
                    for text in events.text(delta.get("content")):
                        yield text
                    for call in delta.get("tool_calls") or ():
                        for text in events.call(call):
                            yield text
                    finish = choice.get("finish_reason") or finish
            for text in events.close():
                yield text
            final = {**shell, **_ending(finish), "output": events.output}
            if usage is not None:
                final["usage"] = self._usage(usage["prompt_tokens"],
                                             usage["prompt_tokens_details"]["cached_tokens"],
                                             usage["completion_tokens"], events.reasoning_text)
            yield events.emit("response.completed" if final["status"] == "completed"
                              else "response.incomplete", response=final)
        finally:
            await chunks.aclose()     # a client gone: the chat stream aborts its request


async def _prepend(first: str, rest: AsyncIterator[str]) -> AsyncIterator[str]:
    yield first
    async for item in rest:
        yield item


def _messages(items) -> list[dict]:
    """Input items as chat messages; a function call and its output as the assistant's tool
    call and the tool's answer."""
    messages: list[dict] = []
    for item in items:
        if isinstance(item, ResponsesMessageItem):
            content = item.content if isinstance(item.content, str) else [
                {"type": "image_url", "image_url": {"url": p.image_url}}
                if isinstance(p, ResponsesImage) else {"type": "text", "text": p.text}
                for p in item.content]
            messages.append({"role": item.role, "content": content})
        elif isinstance(item, ResponsesFunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)     # parallel calls: one assistant turn
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, ResponsesFunctionOutputItem):
            messages.append({"role": "tool", "content": item.output,
                             "tool_call_id": item.call_id})
    if not messages:
        raise bad_request("input has no message", "input")
    return messages


def _ending(finish_reason: str | None) -> dict:
    if finish_reason == "length":
        return {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
    return {"status": "completed"}


def _wants_summary(shell: dict) -> bool:
    return bool(shell["reasoning"] and shell["reasoning"].get("summary"))


def _reasoning_item(item_id: str, text: str, summary: bool, status: str = "completed") -> dict:
    if summary:
        return {"id": item_id, "type": "reasoning", "status": status,
                "summary": [{"type": "summary_text", "text": text}]}
    return {"id": item_id, "type": "reasoning", "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}]}


def _text_part(item: dict) -> dict:
    """The one part an item's text streams into: its summary, or its content."""
    return item["summary"][0] if item["type"] == "reasoning" and item["summary"] \
        else item["content"][0]


def _message_item(item_id: str, text: str, status: str = "completed") -> dict:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _call_item(item_id: str, call_id: str, name: str, arguments: str,
               status: str = "completed") -> dict:
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


class _EventWriter:
    """The Responses stream's events for one output: at most one reasoning item, then the
    message, then one item a function call; each opened when its first delta comes and
    closed (its .done events) when the next kind begins or the stream ends."""

    def __init__(self, shell: dict, summary: bool):
        self.shell, self.summary = shell, summary
        self.sequence = 0
        self.output: list[dict] = []        # the items done so far
        self.open: dict | None = None       # the item being streamed
        self.reasoning_text = ""
        self.calls: dict[int, dict] = {}    # chat tool-call index -> its item

    def emit(self, kind: str, **fields) -> str:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"

    def _start(self, item: dict, part: dict | None) -> list[str]:
        out = self.close()
        self.open = item
        index = len(self.output)
        out.append(self.emit("response.output_item.added", output_index=index, item=item))
        if part is not None:
            out.append(self.emit("response.content_part.added", item_id=item["id"],
                                 output_index=index, content_index=0, part=part))
        return out

    def reasoning(self, delta: str | None) -> list[str]:
        if not delta:
            return []
        out = []
        if self.open is None or self.open["type"] != "reasoning":
            item = _reasoning_item(_item_id("rs"), "", self.summary, "in_progress")
            if not self.summary:
                out = self._start(item, _text_part(item))
            else:   # announced without its summary part, which is added next
                part = item["summary"].pop()
                out = self._start(item, None)
                out.append(self.emit("response.reasoning_summary_part.added",
                                     item_id=item["id"], output_index=len(self.output),
                                     summary_index=0, part=part))
                item["summary"].append(part)
        _text_part(self.open)["text"] += delta
        self.reasoning_text += delta
        where = {"summary_index": 0} if self.summary else {"content_index": 0}
        kind = "reasoning_summary_text" if self.summary else "reasoning_text"
        out.append(self.emit(f"response.{kind}.delta", item_id=self.open["id"],
                             output_index=len(self.output), delta=delta, **where))
        return out

    def text(self, delta: str | None) -> list[str]:
        if not delta:
            return []
        out = []
        if self.open is None or self.open["type"] != "message":
            out = self._start(_message_item(_item_id("msg"), "", "in_progress"),
                              {"type": "output_text", "text": "", "annotations": []})
        self.open["content"][0]["text"] += delta
        out.append(self.emit("response.output_text.delta", item_id=self.open["id"],
                             output_index=len(self.output), content_index=0, delta=delta,
                             logprobs=[]))
        return out

    def call(self, delta: dict) -> list[str]:
        out = []
        item = self.calls.get(delta["index"])
        if item is None:        # a call's first fragment carries its id and name
            function = delta.get("function") or {}
            item = _call_item(_item_id("fc"), delta.get("id") or _item_id("call"),
                              function.get("name") or "", "", "in_progress")
            self.calls[delta["index"]] = item
            out = self._start(item, None)
        arguments = (delta.get("function") or {}).get("arguments") or ""
        if arguments:
            item["arguments"] += arguments
            out.append(self.emit("response.function_call_arguments.delta", item_id=item["id"],
                                 output_index=len(self.output), delta=arguments))
        return out

    def close(self) -> list[str]:
        """The open item's .done events; it joins the output."""
        item, self.open = self.open, None
        if item is None:
            return []
        index, out = len(self.output), []
        item["status"] = "completed"
        if item["type"] == "function_call":
            out.append(self.emit("response.function_call_arguments.done", item_id=item["id"],
                                 output_index=index, arguments=item["arguments"]))
        elif item["type"] == "reasoning" and self.summary:
            part = _text_part(item)
            out.append(self.emit("response.reasoning_summary_text.done", item_id=item["id"],
                                 output_index=index, summary_index=0, text=part["text"]))
            out.append(self.emit("response.reasoning_summary_part.done", item_id=item["id"],
                                 output_index=index, summary_index=0, part=part))
        else:
            part = _text_part(item)
            kind = "reasoning_text" if item["type"] == "reasoning" else "output_text"
            extra = {} if item["type"] == "reasoning" else {"logprobs": []}
            out.append(self.emit(f"response.{kind}.done", item_id=item["id"],
                                 output_index=index, content_index=0, text=part["text"],
                                 **extra))
            out.append(self.emit("response.content_part.done", item_id=item["id"],
                                 output_index=index, content_index=0, part=part))
        out.append(self.emit("response.output_item.done", output_index=index, item=item))
        self.output.append(item)
        return out
