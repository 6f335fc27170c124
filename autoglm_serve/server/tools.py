"""Tools: which structured output a tool_choice implies, and the tool calls in a reply.

As vLLM: `required` and a named function are enforced by a grammar and need no flag; the reply
is then JSON (a list of {"name", "parameters"} for required; the function's arguments for a
named choice). `auto` lets the model choose in its own format, read back by the family's parser
(--enable-auto-tool-choice --tool-call-parser NAME). Without tool_choice, tools mean `auto` on
a server with it enabled, and plain text (the tools reach the chat template) otherwise.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from autoglm_serve.server.errors import bad_request
from autoglm_serve.server.structured_request import checked
from autoglm_serve.server.tool_parsers import TOOL_PARSERS, ToolCall, ToolParser
from autoglm_serve.structured.spec import StructuredSpec

_ANY_OBJECT = {"type": "object"}


@dataclass
class ToolMode:
    kind: str                      # "none" | "auto" | "required" | "named"
    spec: StructuredSpec | None = None
    name: str | None = None        # named: the function
    parser: ToolParser | None = None   # auto: the family's format

    def calls(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """The completed reply as (content, tool calls)."""
        if self.kind == "named":
            return None, [ToolCall(self.name, text)]
        if self.kind == "required":
            try:
                items = json.loads(text)
            except json.JSONDecodeError:      # cut short by max_tokens
                return text, []
            return None, [ToolCall(i["name"], json.dumps(i.get("parameters", {}),
                                                         ensure_ascii=False)) for i in items]
        if self.kind == "auto":
            return self.parser.extract(text)
        return text, []


def _required_schema(tools) -> dict:
    return {"type": "array", "minItems": 1, "items": {"anyOf": [
        {"type": "object", "properties": {
            "name": {"type": "string", "enum": [t.function.name]},
            "parameters": t.function.parameters or _ANY_OBJECT},
         "required": ["name", "parameters"]} for t in tools]}}


def tool_mode(req, settings) -> ToolMode:
    tools, choice = req.tools or [], req.tool_choice
    if choice is None:
        choice = "auto" if tools and settings.enable_auto_tool_choice else "none"
    if choice != "none" and not tools:
        raise bad_request("tool_choice needs tools", "tool_choice")
    if choice == "none":
        return ToolMode("none")
    if choice == "auto":
        if not settings.enable_auto_tool_choice:
            raise bad_request('"auto" tool choice requires --enable-auto-tool-choice and '
                              "--tool-call-parser to be set", "tool_choice")
        return ToolMode("auto", parser=TOOL_PARSERS[settings.tool_call_parser]())
    if choice == "required":
        return ToolMode("required", checked(
            lambda: StructuredSpec.json_schema(_required_schema(tools)), "tools"))
    named = next((t for t in tools if t.function.name == choice.function.name), None)
    if named is None:
        raise bad_request(f"tool_choice names {choice.function.name!r}, which is not in tools",
                          "tool_choice")
    return ToolMode("named", checked(lambda: StructuredSpec.json_schema(
        named.function.parameters or _ANY_OBJECT), "tools"), name=named.function.name)
