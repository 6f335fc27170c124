"""The Llama 3 / SmolLM JSON tool-call format (vLLM's `llama3_json`): the reply is one or more
JSON objects `{"name": NAME, "parameters": {...}}` ("arguments" also taken), separated by `;`,
optionally after Llama's <|python_tag|>."""
from __future__ import annotations

import json

from autoglm_serve.server.tool_parsers.base import ToolCall, ToolParser, arguments_json

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    start_marker = "{"

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        body = text.strip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG):].lstrip()
        if not body.startswith("{"):
            return text, []
        decoder = json.JSONDecoder()
        calls, at = [], 0
        while at < len(body):
            try:
                obj, end = decoder.raw_decode(body, at)
            except json.JSONDecodeError:
                return text, []
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                return text, []
            args = obj.get("parameters", obj.get("arguments"))
            calls.append(ToolCall(obj["name"], args if isinstance(args, str)
                                  else arguments_json(args)))
            at = end
            while at < len(body) and body[at] in " \t\r\n;":
                at += 1
        return None, calls
