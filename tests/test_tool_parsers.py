"""Tool-call parsers per family, on replies in each family's format; calls checked with the
openai SDK's own types."""
from __future__ import annotations

import json

import pytest
from openai.types.chat import ChatCompletionMessageToolCall

from autoglm_serve.server.tool_parsers import TOOL_PARSERS

GLM_REPLY = ("Let me check both.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
             "<arg_value>Beijing</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n"
             "</tool_call>\n<tool_call>get_time\n<arg_key>zone</arg_key>\n"
             "<arg_value>{\"tz\": \"UTC+8\"}</arg_value>\n</tool_call>")


def sdk_calls(calls):
    return [ChatCompletionMessageToolCall.model_validate(c.to_openai()) for c in calls]


@pytest.mark.parametrize("name", ["glm45", "glm4v"])
def test_glm_format(name):
    content, calls = TOOL_PARSERS[name]().extract(GLM_REPLY)
    assert content == "Let me check both."
    first, second = sdk_calls(calls)
    assert first.function.name == "get_weather"
    assert json.loads(first.function.arguments) == {"city": "Beijing", "days": 3}
    assert second.function.name == "get_time"
    assert json.loads(second.function.arguments) == {"zone": {"tz": "UTC+8"}}
    assert first.id != second.id


def test_glm_text_without_calls():
    assert TOOL_PARSERS["glm45"]().extract("Just text.") == ("Just text.", [])


def test_llama3_json_format():
    parser = TOOL_PARSERS["llama3_json"]()
    reply = ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
             '{"name": "get_time", "arguments": {"zone": "CET"}}')
    content, calls = parser.extract(reply)
    assert content is None
    a, b = sdk_calls(calls)
    assert (a.function.name, json.loads(a.function.arguments)) == ("get_weather",
                                                                   {"city": "Paris"})
    assert (b.function.name, json.loads(b.function.arguments)) == ("get_time", {"zone": "CET"})
    # prose, or JSON that is no call, stays content
    assert parser.extract("The answer is 4.") == ("The answer is 4.", [])
    assert parser.extract('{"x": 1}') == ('{"x": 1}', [])
