"""GLM's tool-call format (GLM-4.5 / GLM-4.5V chat templates; vLLM's `glm45` parser):

    <tool_call>NAME
    <arg_key>KEY</arg_key>
    <arg_value>VALUE</arg_value>
    </tool_call>

one block per call, after any content. A value is JSON when it parses as JSON (numbers, objects,
lists), else the string itself, as the template renders non-string arguments with tojson.
"""
from __future__ import annotations

import json
import re

from autoglm_serve.server.tool_parsers.base import ToolCall, ToolParser, arguments_json

_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)
_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


class Glm45ToolParser(ToolParser):
    start_marker = "<tool_call>"

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        at = text.find(self.start_marker)
        if at < 0:
            return text, []
        calls = []
        for block in _CALL.findall(text[at:]):
            name, _, rest = block.strip().partition("\n")
            name = re.split(r"<arg_key>", name, maxsplit=1)[0].strip()
            if not name:
                continue
            args = {k.strip(): _value(v) for k, v in _ARG.findall(block)}
            calls.append(ToolCall(name, arguments_json(args)))
        if not calls:
            return text, []
        content = text[:at].strip()
        return content or None, calls
