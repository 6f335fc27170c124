"""What a tool-call parser does: split a completed text into content and tool calls."""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass


@dataclass
class ToolCall:
    name: str
    arguments: str          # JSON text, as OpenAI's API carries it
    id: str = ""

    def __post_init__(self):
        self.id = self.id or f"call_{uuid.uuid4().hex[:24]}"

    def to_openai(self, index: int | None = None) -> dict:
        out = {"id": self.id, "type": "function",
               "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


class ToolParser:
    # text from which on the model is writing tool calls (streaming holds it back)
    start_marker: str = ""

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content left, calls); no calls: the text is all content."""
        raise NotImplementedError


def arguments_json(value) -> str:
    return json.dumps(value if value is not None else {}, ensure_ascii=False)
