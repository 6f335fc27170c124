"""POST /v1/responses through the real clients (the openai SDK's responses API and its stream
helper, LangChain's ChatOpenAI with `reasoning`, which takes this API) against a real server on
the embedded default, whose chat template opens a thinking block when asked: each answer is the
one the chat endpoint gives the same request, reshaped."""
from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from tests.server_fixtures import metric, server_fixture

MODEL = "smol"
# The prompt ends inside <think> when thinking is on: the model's text is reasoning until </think>.
THINK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking %}<think>{% endif %}{% endif %}")
TAP = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
       "required": ["x", "y"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    template = tmp_path_factory.mktemp("template") / "think.jinja"
    template.write_text(THINK_TEMPLATE)
    # float32: greedy texts are compared across the two endpoints and across stream or not
    yield from server_fixture(["--max-model-len", "1024", "--dtype", "float32",
                               "--served-model-name", MODEL, "--reasoning-parser", "glm45",
                               "--chat-template", str(template)])


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url("/v1"), api_key="EMPTY", timeout=300)


def chat(client, messages, **kw):
    return client.chat.completions.create(model=MODEL, messages=messages, temperature=0, **kw)


def test_a_response_is_the_chat_completion_reshaped(client):
    r = client.responses.create(model=MODEL, instructions="Answer briefly.", input="Say hi",
                                max_output_tokens=64, temperature=0)
    c = chat(client, [{"role": "system", "content": "Answer briefly."},
                      {"role": "user", "content": "Say hi"}], max_tokens=64)
    assert c.choices[0].finish_reason == "stop"       # the model ends well inside the budget
    assert r.status == "completed" and r.id.startswith("resp_") and r.model == MODEL
    assert [o.type for o in r.output] == ["message"]
    assert r.output_text == c.choices[0].message.content and r.output_text
    assert (r.usage.input_tokens, r.usage.output_tokens) == (c.usage.prompt_tokens,
                                                             c.usage.completion_tokens)
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.instructions == "Answer briefly." and r.max_output_tokens == 64


def test_the_stream_rebuilds_the_same_response(client):
    kw = dict(model=MODEL, input=[{"role": "user", "content": "Say hi"}],
              max_output_tokens=64, temperature=0)
    with client.responses.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert final.output_text == client.responses.create(**kw).output_text
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == final.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.usage.output_tokens == final.usage.total_tokens - final.usage.input_tokens > 1


def test_reasoning_comes_as_a_reasoning_item(client):
    r = client.responses.create(model=MODEL, input="Say hi", max_output_tokens=16,
                                temperature=0, reasoning={"effort": "low"})
    c = chat(client, [{"role": "user", "content": "Say hi"}], max_tokens=16,
             extra_body={"enable_thinking": True})
    thought = c.choices[0].message.reasoning_content
    # sixteen tokens end inside the thinking block: incomplete, all of it reasoning
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert [o.type for o in r.output] == ["reasoning"] and thought
    assert r.output[0].content[0].text == thought and r.output[0].summary == []
    assert 0 < r.usage.output_tokens_details.reasoning_tokens <= 16
    plain = client.responses.create(model=MODEL, input="Say hi", max_output_tokens=16,
                                    temperature=0, reasoning={"effort": "none"})
    assert [o.type for o in plain.output] == ["message"]


def test_langchain_streams_the_thinking_it_asked_a_summary_of(server):
    from langchain_openai import ChatOpenAI
    model = ChatOpenAI(model=MODEL, base_url=server.url("/v1"), api_key="EMPTY", temperature=0,
                       max_tokens=16, reasoning={"effort": "low", "summary": "auto"})

    def summary(content) -> str:
        return "".join(s.get("text", "") for block in content if block["type"] == "reasoning"
                       for s in block.get("summary", []))

    answer = model.invoke("Say hi")
    chunks = list(model.stream("Say hi"))
    streamed = sum(chunks[1:], chunks[0])
    assert summary(answer.content) and summary(streamed.content) == summary(answer.content)
    assert streamed.usage_metadata["output_tokens"] == answer.usage_metadata["output_tokens"] == 16


def test_a_named_function_call_and_its_output_go_round(client):
    tools = [{"type": "function", "name": "tap", "description": "Tap the screen at x, y.",
              "parameters": TAP}]
    kw = dict(model=MODEL, input="Tap the home button.", tools=tools, temperature=0,
              tool_choice={"type": "function", "name": "tap"}, max_output_tokens=48)
    r = client.responses.create(**kw)
    call = r.output[0]
    assert [o.type for o in r.output] == ["function_call"] and call.name == "tap"
    assert set(json.loads(call.arguments)) == {"x", "y"}
    with client.responses.stream(**kw) as stream:
        deltas = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output[0].arguments == call.arguments
    follow = client.responses.create(model=MODEL, tools=tools, temperature=0,
                                     max_output_tokens=8, input=[
        {"role": "user", "content": "Tap the home button."},
        {"type": "function_call", "call_id": call.call_id, "name": "tap",
         "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "done"}])
    assert follow.output[-1].type == "message" and follow.usage.input_tokens > r.usage.input_tokens


def test_a_stream_left_at_its_first_event_aborts_the_request(server):
    before = metric(server.metrics(), "vllm:request_success_total")
    body = {"model": MODEL, "input": "Tell a long story.", "stream": True,
            "max_output_tokens": 1000, "ignore_eos": True}
    with httpx.stream("POST", server.url("/v1/responses"), json=body, timeout=60) as r:
        assert next(r.iter_lines()) == "event: response.created"
    deadline = time.monotonic() + 10      # long before 1,000 tokens on a CPU
    while metric(server.metrics(), "vllm:num_requests_running") and time.monotonic() < deadline:
        time.sleep(0.1)
    samples = server.metrics()
    assert metric(samples, "vllm:num_requests_running") == 0
    assert metric(samples, "vllm:request_success_total") - before == 1   # the abort's count
    assert sum(v for k, v in samples.items() if k.startswith("vllm:request_success_total")
               and 'finished_reason="abort"' in k) >= 1


@pytest.mark.parametrize("body, status, param", [
    ({"input": "hi", "previous_response_id": "resp_1"}, 400, "previous_response_id"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, 400, None),
    ({"input": []}, 400, "input"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"},
                {"role": "narrator", "content": "x"}]}, 400, None),
    ({"input": "hi", "temperature": -1}, 400, "temperature"),
    ({"input": "hi", "tool_choice": "required"}, 400, "tool_choice"),
    ({"input": "hi", "top_k": "many"}, 400, "top_k"),
    ({"input": "hi", "model": "gpt-4o"}, 404, "model"),
], ids=["stored-state", "builtin-tool", "no-input", "bad-role", "temperature", "no-tools",
        "extra-checked", "unknown-model"])
def test_bad_requests_get_openai_errors(server, body, status, param):
    r = httpx.post(server.url("/v1/responses"), json={"model": MODEL, **body}, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"] and (param is None or error["param"] == param), error


def test_input_items_become_the_chat_messages_vllm_would_render():
    """Images as image_url parts, a turn's parallel function calls as one assistant message
    with both calls, their outputs as tool messages, earlier reasoning left out."""
    from autoglm_serve.server.protocol import ResponsesRequest
    from autoglm_serve.server.serving_responses import _messages

    req = ResponsesRequest.model_validate({"input": [
        {"role": "user", "content": [
            {"type": "input_text", "text": "What is on the screen?"},
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "tap", "arguments": "{\"x\": 1}"},
        {"type": "function_call", "call_id": "c2", "name": "swipe", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "tapped"},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Done."}]}]})
    assert _messages(req.input) == [
        {"role": "user", "content": [
            {"type": "text", "text": "What is on the screen?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "tap",
                                                          "arguments": "{\"x\": 1}"}},
            {"id": "c2", "type": "function", "function": {"name": "swipe", "arguments": "{}"}}]},
        {"role": "tool", "content": "tapped", "tool_call_id": "c1"},
        {"role": "assistant", "content": [{"type": "text", "text": "Done."}]}]
