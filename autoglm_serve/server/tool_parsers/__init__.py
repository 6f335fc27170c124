"""Tool-call parsers by model family, for tool_choice "auto" (--tool-call-parser NAME)."""
from autoglm_serve.server.tool_parsers.base import ToolCall, ToolParser
from autoglm_serve.server.tool_parsers.glm45 import Glm45ToolParser
from autoglm_serve.server.tool_parsers.llama3_json import Llama3JsonToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "glm45": Glm45ToolParser, "glm4": Glm45ToolParser, "glm4v": Glm45ToolParser,
    "glm4_moe": Glm45ToolParser, "llama3_json": Llama3JsonToolParser,
}

__all__ = ["TOOL_PARSERS", "ToolCall", "ToolParser"]
