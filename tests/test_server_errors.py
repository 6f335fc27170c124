"""Bad requests: each gets its status and an OpenAI-shaped error, and the server stays healthy."""
from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tests.server_fixtures import metric, server_fixture

KEY = "sk-test-key"
MAX_LEN = 512
CHAT, COMP = "/v1/chat/completions", "/v1/completions"
OK_MSG = [{"role": "user", "content": "hi"}]


def chat(**fields):
    return {"messages": OK_MSG, "max_tokens": 2, **fields}


# (name, method, path, body (dict, or bytes sent as is), headers, status, param, text in message)
CASES = [
    ("malformed json", "POST", CHAT, b'{"messages": [', None, 400, None, "Malformed JSON"),
    ("body is an array", "POST", CHAT, b"[1, 2]", None, 400, None, "JSON object"),
    ("messages missing", "POST", CHAT, {"max_tokens": 2}, None, 400, "messages", "required"),
    ("messages not a list", "POST", CHAT, {"messages": "hi"}, None, 400, "messages", None),
    ("empty messages", "POST", CHAT, {"messages": []}, None, 400, "messages", None),
    ("invalid role", "POST", CHAT, {"messages": [{"role": "robot", "content": "x"}]}, None, 400,
     "messages.0.role", None),
    ("content wrong type", "POST", CHAT, {"messages": [{"role": "user", "content": 5}]}, None,
     400, "messages.0.content", None),
    ("unknown content part", "POST", CHAT,
     {"messages": [{"role": "user", "content": [{"type": "audio", "x": 1}]}]}, None, 400,
     "messages.0.content.0", None),
    ("max_tokens 0", "POST", CHAT, chat(max_tokens=0), None, 400, "max_tokens", "max_tokens"),
    ("max_tokens negative", "POST", CHAT, chat(max_tokens=-5), None, 400, "max_tokens", None),
    ("max_tokens float", "POST", CHAT, chat(max_tokens=2.5), None, 400, "max_tokens", None),
    ("max_completion_tokens 0", "POST", CHAT, chat(max_completion_tokens=0), None, 400,
     "max_completion_tokens", "max_completion_tokens"),
    ("n 0", "POST", CHAT, chat(n=0), None, 400, "n", None),
    ("temperature < 0", "POST", CHAT, chat(temperature=-0.5), None, 400, "temperature", None),
    ("temperature string", "POST", CHAT, chat(temperature="hot"), None, 400, "temperature", None),
    # pydantic's lax mode took these as 0.0 and 0.5 (found by tests/test_fuzz_openapi.py)
    ("presence_penalty false", "POST", CHAT, chat(presence_penalty=False), None, 400,
     "presence_penalty", None),
    ("temperature numeric string", "POST", COMP, {"prompt": "hi", "temperature": "0.5"}, None,
     400, "temperature", None),
    ("top_p > 1", "POST", CHAT, chat(top_p=1.5), None, 400, "top_p", None),
    ("top_p 0", "POST", CHAT, chat(top_p=0), None, 400, "top_p", None),
    ("top_k -2", "POST", CHAT, chat(top_k=-2), None, 400, "top_k", None),
    ("min_p 2", "POST", CHAT, chat(min_p=2), None, 400, "min_p", None),
    ("frequency_penalty 3", "POST", CHAT, chat(frequency_penalty=3), None, 400,
     "frequency_penalty", None),
    ("presence_penalty -3", "POST", CHAT, chat(presence_penalty=-3), None, 400,
     "presence_penalty", None),
    ("repetition_penalty 0", "POST", CHAT, chat(repetition_penalty=0), None, 400,
     "repetition_penalty", None),
    ("seed string", "POST", CHAT, chat(seed="abc"), None, 400, "seed", None),
    ("stream not bool", "POST", CHAT, chat(stream="yes"), None, 400, "stream", None),
    ("stream_options without stream", "POST", CHAT, chat(stream_options={"include_usage": True}),
     None, 400, "stream_options", "stream"),
    ("top_logprobs without logprobs", "POST", CHAT, chat(top_logprobs=2), None, 400,
     "top_logprobs", None),
    ("top_logprobs 50", "POST", CHAT, chat(logprobs=True, top_logprobs=50), None, 400,
     "top_logprobs", None),
    ("stop not strings", "POST", CHAT, chat(stop=[1, 2]), None, 400, "stop.0", None),
    ("min_tokens > max_tokens", "POST", CHAT, chat(min_tokens=5), None, 400, "min_tokens", None),
    ("too-long chat prompt", "POST", CHAT,
     {"messages": [{"role": "user", "content": "word " * 2000}]}, None, 400, "messages",
     f"maximum context length is {MAX_LEN}"),
    ("too-long token prompt", "POST", COMP, {"prompt": [1] * 600}, None, 400, "prompt",
     "prompt has 600 tokens"),
    ("empty prompt", "POST", COMP, {"prompt": ""}, None, 400, "prompt", "empty"),
    ("token id out of vocab", "POST", COMP, {"prompt": [10**7]}, None, 400, "prompt",
     "vocabulary"),
    ("completions logprobs 30", "POST", COMP, {"prompt": "hi", "logprobs": 30}, None, 400,
     "logprobs", None),
    ("unknown model", "POST", CHAT, chat(model="gpt-9"), None, 404, "model", "gpt-9"),
    ("unknown model, completions", "POST", COMP, {"prompt": "x", "model": "nope"}, None, 404,
     "model", None),
    ("missing API key", "POST", CHAT, chat(), {"Authorization": ""}, 401, None, "API key"),
    ("wrong API key", "POST", CHAT, chat(), {"Authorization": "Bearer wrong"}, 401, None,
     "API key"),
    ("wrong key on models", "GET", "/v1/models", None, {"Authorization": "Bearer x"}, 401,
     None, None),
    ("oversized body", "POST", CHAT, b'{"messages": "' + b"a" * (2 * 2**20) + b'"}', None, 413,
     None, "limit"),
    ("unknown route", "POST", "/v1/embeddingz", {}, None, 404, None, None),
    ("wrong method", "GET", CHAT, None, None, 405, None, None),
    # hostile values that once stopped the engine, queued forever or were ignored (issue 16)
    ("seed 2^64", "POST", CHAT, chat(seed=2**64), None, 400, "seed", "seed"),
    ("seed 2^64, completions", "POST", COMP, {"prompt": "hi", "seed": 2**64}, None, 400, "seed",
     None),
    ("seed below int64", "POST", CHAT, chat(seed=-2**63 - 1), None, 400, "seed", None),
    ("n 100000", "POST", CHAT, chat(n=100000), None, 400, "n", "--max-n"),
    ("n 100000, completions", "POST", COMP, {"prompt": "hi", "n": 100000}, None, 400, "n", None),
    ("n x prompts over the queue", "POST", COMP, {"prompt": ["hi"] * 40, "n": 4}, None, 400,
     "n", "sequences"),
    ("best_of > n", "POST", COMP, {"prompt": "hi", "best_of": 3}, None, 400, "best_of", None),
    ("temperature Infinity", "POST", CHAT,
     b'{"messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}', None, 400,
     "temperature", "finite"),
    ("top_p NaN", "POST", COMP, b'{"prompt": "hi", "top_p": NaN}', None, 400, "top_p", None),
    ("lone surrogate in a message", "POST", CHAT,
     b'{"messages": [{"role": "user", "content": "a\\ud800b"}], "max_tokens": 2}', None, 400,
     "messages.0.content", "surrogate"),
    ("lone surrogate in a text part", "POST", CHAT,
     b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}',
     None, 400, "messages.0.content.0.text", "surrogate"),
    ("lone surrogate in a prompt", "POST", COMP, b'{"prompt": "\\ud800"}', None, 400, "prompt",
     "surrogate"),
    ("logit_bias out of range", "POST", CHAT, chat(logit_bias={"42": 500}), None, 400,
     "logit_bias", "[-100, 100]"),
    ("logit_bias key not a token id", "POST", CHAT, chat(logit_bias={"x": 5}), None, 400,
     "logit_bias", "token ids"),
    ("tool_choice always", "POST", CHAT, chat(tool_choice="always"), None, 400, "tool_choice",
     None),
    ("tool_choice required without tools", "POST", CHAT, chat(tool_choice="required"), None,
     400, "tool_choice", "needs tools"),
    ("response_format xml", "POST", CHAT, chat(response_format={"type": "xml"}), None, 400,
     "response_format.type", None),
    ("response_format json_schema without a schema", "POST", CHAT,
     chat(response_format={"type": "json_schema"}), None, 400, "response_format.json_schema",
     "schema"),
    ("max_tokens beyond the context", "POST", CHAT, chat(max_tokens=MAX_LEN), None, 400,
     "max_tokens", "maximum context length"),
    ("max_completion_tokens beyond the context", "POST", CHAT,
     chat(max_completion_tokens=MAX_LEN), None, 400, "max_completion_tokens", None),
    ("max_tokens beyond the context, completions", "POST", COMP,
     {"prompt": "hi", "max_tokens": 10**6}, None, 400, "max_tokens", None),
    ("a request's chat_template", "POST", CHAT,
     chat(chat_template="{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                        "{% endfor %}"), None, 400, "chat_template", "--trust-request"),
    ("detokenize out of vocab", "POST", "/detokenize", {"tokens": [-1]}, None, 400, "tokens",
     None),
    ("tokenize nothing", "POST", "/tokenize", {}, None, 400, "prompt", None),
]


@pytest.fixture(scope="module")
def server():
    yield from server_fixture(["--max-model-len", str(MAX_LEN), "--api-key", KEY,
                               "--max-request-body-mb", "1", "--max-num-seqs", "2",
                               "--max-waiting-requests", "2", "--kv-cache-memory-gib", "0.25",
                               "--max-n", "4"],
                              api_key=KEY)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, headers=server.headers(), timeout=120) as c:
        yield c


def _good_request_works(http) -> None:
    r = http.post(CHAT, json=chat(max_tokens=1))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] is not None


def test_at_least_25_cases():
    assert len(CASES) >= 25


@pytest.mark.parametrize("name,method,path,body,headers,status,param,text", CASES,
                         ids=[c[0] for c in CASES])
def test_bad_request(http, server, name, method, path, body, headers, status, param, text):
    merged = httpx.Headers(http.headers)
    merged.update(headers or {})
    kwargs = {"headers": merged}
    if isinstance(body, bytes):
        kwargs["content"] = body
        kwargs["headers"]["content-type"] = "application/json"
    elif body is not None:
        kwargs["json"] = body
    r = http.request(method, path, **kwargs)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert "Traceback" not in r.text and "File \"" not in r.text
    assert err["param"] == param, err
    if text:
        assert text in err["message"], err
    if status == 401:
        assert err["code"] == "invalid_api_key"
    if status == 404 and param == "model":
        assert err["code"] == "model_not_found"
    assert server.healthy()
    _good_request_works(http)


def test_oversized_chunked_body_is_413(http):
    def body():
        yield b'{"messages": "'
        for _ in range(40):
            yield b"a" * 65536
        yield b'"}'
    r = http.post(CHAT, content=body(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    _good_request_works(http)


def test_health_and_metrics_need_no_key(server):
    assert httpx.get(server.url("/health")).status_code == 200
    assert httpx.get(server.url("/metrics")).status_code == 200
    assert httpx.get(server.url("/v1/models")).status_code == 401


def test_openai_sdk_raises_typed_errors(server):
    client = openai.OpenAI(base_url=server.url("/v1"), api_key=KEY)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=OK_MSG,
                                       temperature=-1)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=OK_MSG)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url("/v1"), api_key="bad").models.list()


def test_seeds_at_the_ends_of_the_range_are_served(http):
    """vLLM's range, int64; with n children seed + i runs past it and wraps (torch's range)."""
    for seed in (2**63 - 1, -2**63, -1):
        r = http.post(CHAT, json=chat(seed=seed, n=2, temperature=1.0))
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"]) == 2


def test_a_max_n_request_fits_beside_others(server):
    """n at the server's --max-n (4 here) with 2 + 2 slots: served, not refused or queued
    forever; one more sequence than the queue holds is a 400, never a lock-up."""
    with httpx.Client(base_url=server.base_url, headers=server.headers(), timeout=120) as c:
        r = c.post(COMP, json={"prompt": "hi", "n": 4, "max_tokens": 2})
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"]) == 4
        r = c.post(COMP, json={"prompt": ["hi", "yo"], "n": 3, "max_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text


def test_full_queue_is_503_then_recovers(server, http):
    """2 running + 2 waiting fill this server; the next request is refused, not queued."""
    body = {"messages": OK_MSG, "max_tokens": 400, "ignore_eos": True, "stream": True}

    async def hold(c: httpx.AsyncClient):
        async with c.stream("POST", CHAT, json=body) as r:
            async for _ in r.aiter_lines():
                pass

    async def run():
        async with httpx.AsyncClient(base_url=server.base_url, headers=server.headers(),
                                     timeout=300) as c:
            tasks = [asyncio.create_task(hold(c)) for _ in range(4)]
            for _ in range(600):
                m = server.metrics()
                if metric(m, "vllm:num_requests_running") + \
                        metric(m, "vllm:num_requests_waiting") == 4:
                    break
                await asyncio.sleep(0.1)
            r = await c.post(CHAT, json=chat())
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return r

    r = asyncio.run(run())
    assert r.status_code == 503, r.text
    assert r.json()["error"]["type"] == "server_error"
    assert "capacity" in r.json()["error"]["message"]
    assert r.headers["retry-after"] == "1"
    assert server.healthy()
    _good_request_works(http)


def test_server_log_has_no_traceback_for_client_errors(server):
    assert "Traceback" not in server.log(200_000)
