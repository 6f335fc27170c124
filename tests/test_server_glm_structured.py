"""A tiny random GLM-4.1V through the real server: Open-AutoGLM's action grammar (sampled at
temperature 1, every answer parses under Open-AutoGLM's own rules, reimplemented below from
phone_agent/model/client.py and phone_agent/actions/handler.py, and the response carries the
parsed action beside the text), and GLM's tool-call format read back under tool_choice auto."""
from __future__ import annotations

import ast
import json

import pytest
from openai import OpenAI

from tests.glm4v_fixtures import make_tiny_glm4v
from tests.server_fixtures import server_fixture

MODEL = "autoglm-phone-9b"
HANDLED = {"Launch", "Tap", "Type", "Type_Name", "Swipe", "Back", "Home", "Double Tap",
           "Long Press", "Wait", "Take_over", "Note", "Call_API", "Interact"}
MESSAGES = [{"role": "system", "content": "You are a phone agent."},
            {"role": "user", "content": "Task: open Settings"}]


def split_response(content: str) -> tuple[str, str]:
    """Open-AutoGLM's ModelClient._parse_response: the action from the first marker on."""
    for marker in ("finish(message=", "do(action="):
        if marker in content:
            before, after = content.split(marker, 1)
            return before.strip(), marker + after
    if "<answer>" in content:
        before, after = content.split("<answer>", 1)
        return (before.replace("<think>", "").replace("</think>", "").strip(),
                after.replace("</answer>", "").strip())
    return "", content


def open_autoglm_parse_action(response: str) -> dict:
    """Open-AutoGLM's parse_action, rule for rule; raises ValueError where it does."""
    response = response.strip()
    if response.startswith('do(action="Type"') or response.startswith('do(action="Type_Name"'):
        return {"_metadata": "do", "action": "Type", "text": response.split("text=", 1)[1][1:-2]}
    if response.startswith("do"):
        response = response.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
        tree = ast.parse(response, mode="eval")
        if not isinstance(tree.body, ast.Call):
            raise ValueError("Expected a function call")
        action = {"_metadata": "do"}
        for keyword in tree.body.keywords:
            action[keyword.arg] = ast.literal_eval(keyword.value)
        return action
    if response.startswith("finish"):
        return {"_metadata": "finish",
                "message": response.replace("finish(message=", "")[1:-2]}
    raise ValueError(f"Failed to parse action: {response}")


def check_action(action: dict) -> None:
    """What ActionHandler.execute needs to run it: a known action, points in 0..999."""
    if action["_metadata"] == "finish":
        assert isinstance(action["message"], str)
        return
    assert action["action"] in HANDLED, action
    for key in ("element", "start", "end"):
        if key in action:
            x, y = action[key]
            assert 0 <= x <= 999 and 0 <= y <= 999, action


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = make_tiny_glm4v(tmp_path_factory.mktemp("tiny-glm4v"))
    yield from server_fixture([str(model), "--served-model-name", MODEL, "--max-model-len",
                               "1024", "--default-structured-grammar", "autoglm_action",
                               "--enable-auto-tool-choice", "--tool-call-parser", "glm45"])


def test_hundred_sampled_answers_parse(server):
    client = OpenAI(base_url=server.url("/v1"), api_key="EMPTY", max_retries=0)
    r = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, n=100, temperature=1.0, seed=0, max_tokens=120,
        extra_body={"structured_outputs": {"grammar": "autoglm_action", "max_text_chars": 6}})
    assert len(r.choices) == 100
    kinds = set()
    for choice in r.choices:
        content = choice.message.content
        assert choice.finish_reason == "stop", content
        assert content.startswith("<think>") and "</think><answer>" in content, content
        thinking, answer = split_response(content)
        action = open_autoglm_parse_action(answer)
        check_action(action)
        if action.get("action") != "Type":  # its parse drops the other keys, as Open-AutoGLM's
            assert choice.message.model_extra["action"] == action
        kinds.add(action.get("action", "finish"))
    assert len(kinds) >= 5, kinds      # the grammar, not one lucky path, made them all parse


def test_server_default_grammar(server):
    """--default-structured-grammar: a plain request is held to the action grammar too."""
    client = OpenAI(base_url=server.url("/v1"), api_key="EMPTY", max_retries=0)
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=1.0,
                                            seed=1, max_tokens=12, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text.startswith("<think>"), text
    thinking = text[len("<think>"):].split("</think>", 1)[0]
    assert "<" not in thinking and "=" not in thinking, text


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}
GLM_CALL = ("Checking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
            "<arg_value>Beijing</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n"
            "</tool_call>")


def test_auto_tool_calls_in_glm_format(server):
    """tool_choice auto (the default with tools on this server): the reply, forced here to a
    GLM-format call by a one-option choice, comes back as a tool call, streamed or not."""
    client = OpenAI(base_url=server.url("/v1"), api_key="EMPTY", max_retries=0)
    kw = dict(model=MODEL, messages=MESSAGES, tools=[WEATHER], max_tokens=200,
              extra_body={"guided_choice": [GLM_CALL]})
    r = client.chat.completions.create(**kw)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking."
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Beijing", "days": 3}
    chunks = list(client.chat.completions.create(stream=True, **kw))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert content.strip() == "Checking." and "<tool_call>" not in content
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == \
        [("get_weather", {"city": "Beijing", "days": 3})]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
