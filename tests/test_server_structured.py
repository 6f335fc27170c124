"""Structured outputs, tools and logit_bias through the real server on the embedded default
(SmolLM2-135M), with the openai SDK: what the grammar allows is all that comes back."""
from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageToolCall

from tests.server_fixtures import server_fixture

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 16},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "role": {"enum": ["admin", "user", "guest"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    "address": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
        "required": ["city", "zip"], "additionalProperties": False}},
    "required": ["name", "age", "role", "tags", "address"], "additionalProperties": False}
INVENTORY = {"type": "object", "properties": {
    "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
        "type": "object", "properties": {
            "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
            "count": {"type": "integer", "minimum": 1, "maximum": 9},
            "in_stock": {"type": "boolean"}},
        "required": ["sku", "count", "in_stock"]}}},
    "required": ["items"]}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "maxLength": 10}}, "required": ["zone"]}}}
M = "SmolLM2-135M-Instruct"
ASK = [{"role": "user", "content": "Describe a person as JSON."}]


@pytest.fixture(scope="module")
def server():
    # float32: echo's prompt logprobs are compared with single-token requests', computed in
    # other batches (the CPU's bf16 default rounds differently with the batch)
    yield from server_fixture(["--max-model-len", "1024", "--dtype", "float32"])


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.url("/v1"), api_key="EMPTY", max_retries=0)


def json_schema_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema,
                                                   "strict": True}}


@pytest.mark.parametrize("schema", [PERSON, INVENTORY], ids=["person", "inventory"])
def test_json_schema_validates(client, schema):
    # sampled at temperature 1, three sequences at once, so that the grammar, not luck, decides
    r = client.chat.completions.create(
        model=M, messages=ASK, max_tokens=160, temperature=1.0, seed=0, n=3,
        response_format=json_schema_format(schema))
    for choice in r.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), schema)


def test_json_schema_streamed(client):
    stream = client.chat.completions.create(
        model=M, messages=ASK, max_tokens=160, temperature=1.0, seed=7, stream=True,
        response_format=json_schema_format(PERSON))
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(text), PERSON)


def test_vllm_fields(client):
    r = client.chat.completions.create(model=M, messages=ASK, max_tokens=20,
                                       extra_body={"guided_choice": ["yes", "no"]})
    assert r.choices[0].message.content in ("yes", "no")
    r = client.chat.completions.create(
        model=M, messages=ASK, max_tokens=20, temperature=1.0, seed=3,
        extra_body={"structured_outputs": {"regex": "[a-c]{2}-[0-9]{3}"}})
    content = r.choices[0].message.content
    assert len(content) == 6 and content[2] == "-" and content[3:].isdigit(), content
    r = client.completions.create(model=M, prompt="JSON:", max_tokens=200, temperature=1.0,
                                  seed=1, extra_body={"guided_json": INVENTORY})
    assert r.choices[0].finish_reason == "stop", r.choices[0].text
    jsonschema.validate(json.loads(r.choices[0].text), INVENTORY)
    r = client.chat.completions.create(
        model=M, messages=ASK, max_tokens=20, temperature=1.0, seed=5,
        extra_body={"structured_outputs": {"grammar": 'root ::= "A" [0-9] [0-9] "!"'}})
    content = r.choices[0].message.content
    assert content[0] == "A" and content[1:3].isdigit() and content[3] == "!", content


@pytest.mark.parametrize("body, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}}},
     "response_format.json_schema.schema"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_regex": "([a-z"}, "guided_regex"),
    ({"structured_outputs": {"grammar": "root ::= ("}}, "structured_outputs.grammar"),
    ({"guided_choice": ["a"], "guided_regex": "a"}, "guided_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "auto"}, "tool_choice"),   # not enabled here
    ({"logit_bias": {"5": 101}}, "logit_bias"),
])
def test_bad_structured_request_is_400(server, client, body, param):
    r = httpx.post(server.url("/v1/chat/completions"),
                   json={"messages": ASK, "max_tokens": 4, **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()
    # and the server keeps serving
    assert client.chat.completions.create(model=M, messages=ASK, max_tokens=2).choices


def test_required_always_calls_a_tool(client):
    r = client.chat.completions.create(
        model=M, messages=[{"role": "user", "content": "Weather or time in Paris?"}],
        tools=[WEATHER, TIME], tool_choice="required", max_tokens=120, temperature=1.0,
        seed=0, n=4)
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls"
        assert choice.message.tool_calls
        for call in choice.message.tool_calls:
            assert isinstance(call, ChatCompletionMessageToolCall)
            tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
            jsonschema.validate(json.loads(call.function.arguments),
                                tool["function"]["parameters"])


def test_named_tool_choice_streamed_and_not(client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    r = client.chat.completions.create(model=M, messages=msgs, tools=[WEATHER, TIME],
                                       tool_choice=named, max_tokens=80, temperature=1.0,
                                       seed=2)
    (call,) = r.choices[0].message.tool_calls
    assert isinstance(call, ChatCompletionMessageToolCall) and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    # streamed: the first delta names the call, the rest carry argument fragments
    chunks = list(client.chat.completions.create(
        model=M, messages=msgs, tools=[WEATHER], tool_choice=named, max_tokens=80,
        temperature=1.0, seed=2, stream=True))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].id and deltas[0].function.name == "get_weather"
    assert all(d.index == 0 for d in deltas)
    args = "".join(d.function.arguments or "" for d in deltas)
    assert args == call.function.arguments     # same seed, same call
    jsonschema.validate(json.loads(args), WEATHER["function"]["parameters"])


def test_logit_bias_bans_and_forces(client, server):
    tok = httpx.post(server.url("/tokenize"), json={"prompt": " the"}, timeout=30).json()
    forced = tok["tokens"][-1]
    r = client.completions.create(model=M, prompt="Once upon a time", max_tokens=6,
                                  temperature=0, logit_bias={str(forced): 100})
    ids = httpx.post(server.url("/tokenize"), json={"prompt": r.choices[0].text,
                                                    "add_special_tokens": False},
                     timeout=30).json()["tokens"]
    assert ids and set(ids) == {forced}
    # ban the token greedy decoding picks first: greedy picks another, sampling never it
    free = client.completions.create(model=M, prompt="Once upon a time", max_tokens=1,
                                     temperature=0, logprobs=0)
    first = free.choices[0].logprobs.tokens[0]
    first_id = httpx.post(server.url("/tokenize"), json={"prompt": first,
                                                         "add_special_tokens": False},
                          timeout=30).json()["tokens"][0]
    greedy = client.completions.create(model=M, prompt="Once upon a time", max_tokens=1,
                                       temperature=0, logprobs=0,
                                       logit_bias={str(first_id): -100})
    assert greedy.choices[0].logprobs.tokens[0] != first
    banned = client.completions.create(model=M, prompt="Once upon a time", max_tokens=8,
                                       temperature=1.0, seed=0, n=4, logprobs=0,
                                       logit_bias={str(first_id): -100})
    for c in banned.choices:
        assert first not in c.logprobs.tokens, c.logprobs.tokens


def test_echo(client):
    r = client.completions.create(model=M, prompt="Echo me", max_tokens=3, temperature=0,
                                  echo=True)
    plain = client.completions.create(model=M, prompt="Echo me", max_tokens=3, temperature=0)
    assert r.choices[0].text == "Echo me" + plain.choices[0].text


def test_echo_logprobs_are_the_models(client, server):
    """Each echoed prompt token's logprob is the one the model gives it as the next token of
    the prompt before it (a 1-token completion of that prefix, with its top logprobs)."""
    ids = httpx.post(server.url("/tokenize"), json={"prompt": "The cat sat on the mat"},
                     timeout=30).json()["tokens"]
    r = client.completions.create(model=M, prompt=ids, max_tokens=2, temperature=0,
                                  echo=True, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(ids) + 2
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(isinstance(v, float) for v in lp.token_logprobs[1:])
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    assert "".join(lp.tokens) == r.choices[0].text
    for i in (1, len(ids) // 2, len(ids) - 1):
        prefix = client.completions.create(model=M, prompt=ids[:i], max_tokens=1,
                                           temperature=0, logprobs=20,
                                           logit_bias={str(ids[i]): 100})
        # forced to the prompt's next token: its sampled logprob is the raw one
        assert prefix.choices[0].logprobs.token_logprobs[0] == pytest.approx(
            lp.token_logprobs[i], abs=2e-3)
    stream = list(client.completions.create(model=M, prompt=ids, max_tokens=2, temperature=0,
                                            echo=True, logprobs=3, stream=True))
    text = "".join(c.choices[0].text for c in stream if c.choices)
    assert text == r.choices[0].text
    streamed = [v for c in stream if c.choices and c.choices[0].logprobs
                for v in c.choices[0].logprobs.token_logprobs]
    assert streamed[1:] == pytest.approx(lp.token_logprobs[1:], abs=2e-3)
