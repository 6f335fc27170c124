"""The real clients (openai SDK, LangChain ChatOpenAI, Open-AutoGLM's request shape) against a real
server on the embedded default model."""
from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from tests.server_fixtures import metric, server_fixture

MODEL = "autoglm-phone-9b"
# The prompt ends inside <think>, so everything the model writes is reasoning until </think>.
THINK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking %}<think>{% endif %}{% endif %}")


@pytest.fixture(scope="module")
def server():
    # max_new_tokens bounds the unbounded chat requests (the LangChain snippet sets no
    # max_tokens) so the test stays short on a CPU; requests' own max_tokens still win. float32:
    # these tests compare greedy texts across requests (stream against not, alone against in a
    # batch), and the CPU's bf16 default rounds differently with the batch and the prefix cache.
    yield from server_fixture(["--max-model-len", "2048", "--dtype", "float32",
                               "--served-model-name", MODEL, "smol",
                               "--override-generation-config", '{"max_new_tokens": 48}',
                               "--trust-request-chat-template"])


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url("/v1"), api_key="EMPTY", timeout=300)


@pytest.fixture(scope="module")
def tokenizer():
    from autoglm_serve.loader.default_model import default_model_path
    from autoglm_serve.tokenizer import load_tokenizer
    return load_tokenizer(default_model_path())


def _greedy(client, content, **kw):
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], temperature=0, **kw)


def test_models_lists_served_names_with_max_model_len(server, client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL, "smol"]
    raw = httpx.get(server.url("/v1/models")).json()["data"][0]
    assert raw["max_model_len"] == 2048 and raw["object"] == "model"
    assert httpx.get(server.url("/version")).json()["version"]
    # The second served name is accepted too and echoed back.
    out = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=2)
    assert out.model == "smol"


def test_langchain_deployment_guide_snippet(server):
    from langchain_openai import ChatOpenAI
    chat_model = ChatOpenAI(model="autoglm-phone-9b", temperature=0.5, base_url=server.url("/v1"),
                            api_key="EMPTY",
                            extra_body={"enable_thinking": True, "return_reasoning": True},
                            streaming=True)
    answer = chat_model.invoke("你是谁？")
    assert isinstance(answer.content, str) and answer.content.strip()

    async def ten():
        return await asyncio.gather(*[chat_model.ainvoke("你好") for _ in range(10)])

    answers = asyncio.run(ten())
    assert len(answers) == 10
    assert all(isinstance(a.content, str) and a.content.strip() for a in answers)


def test_stream_joined_equals_non_stream(client):
    kw = dict(max_tokens=24, seed=0)
    full = _greedy(client, "Name three colors.", **kw)
    chunks = list(_greedy(client, "Name three colors.", stream=True,
                          stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content and text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_without_include_usage_has_no_usage_chunk(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "stream": True}
    with httpx.stream("POST", server.url("/v1/chat/completions"), json=body, timeout=120) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    assert all(p["choices"] and "usage" not in p for p in parsed)
    assert parsed[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_usage_equals_tokenizer_counts(client, tokenizer):
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Count from one to five."}]
    out = client.chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                         max_tokens=10, logprobs=True)
    expected_prompt = tokenizer.apply_chat_template(messages, tokenize=False,
                                                    add_generation_prompt=True)
    assert out.usage.prompt_tokens == len(tokenizer.encode(expected_prompt,
                                                           add_special_tokens=False))
    # One logprob entry per generated token: the count the server reports is the real one.
    n_tokens = len(out.choices[0].logprobs.content)
    assert out.usage.completion_tokens == n_tokens
    assert out.usage.total_tokens == out.usage.prompt_tokens + n_tokens
    if out.choices[0].finish_reason == "length":
        assert n_tokens == 10
    text = out.choices[0].message.content
    assert "".join(t.token for t in out.choices[0].logprobs.content).startswith(text)


def test_n_gives_n_choices(client):
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                         n=3, temperature=1.0, seed=7, max_tokens=8)
    assert sorted(c.index for c in out.choices) == [0, 1, 2]
    assert all(c.message.content for c in out.choices)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], n=3, temperature=1.0, seed=7,
        max_tokens=8, stream=True)
    texts = {0: "", 1: "", 2: ""}
    finished = set()
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1, 2}
    # Same seed, same per-choice text whether streamed or not.
    assert [texts[i] for i in range(3)] == [c.message.content for c in
                                            sorted(out.choices, key=lambda c: c.index)]


def test_stop_strings(client):
    base = _greedy(client, "Write a sentence about the sea.", max_tokens=30)
    text = base.choices[0].message.content
    words = text.split()
    assert len(words) >= 4, text
    stop = " " + words[2]
    cut = text[:text.index(stop)]
    out = _greedy(client, "Write a sentence about the sea.", max_tokens=30, stop=[stop, "zzqx"])
    assert out.choices[0].message.content == cut
    assert out.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].delta.content or "" for c in _greedy(
        client, "Write a sentence about the sea.", max_tokens=30, stop=stop, stream=True)
        if c.choices)
    assert streamed == cut


def test_logprobs_chat_and_completions(client):
    out = _greedy(client, "Say yes.", max_tokens=6, logprobs=True, top_logprobs=3)
    items = out.choices[0].logprobs.content
    assert len(items) == out.usage.completion_tokens
    for item in items:
        assert item.logprob <= 0 and len(item.top_logprobs) == 3
        tops = [t.logprob for t in item.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        # Greedy: the chosen token is the most likely one.
        assert item.token == item.top_logprobs[0].token
        assert item.logprob == pytest.approx(tops[0])
        assert item.bytes == list(item.token.encode())
    none = _greedy(client, "Say yes.", max_tokens=2)
    assert none.choices[0].logprobs is None
    comp = client.completions.create(model=MODEL, prompt="The capital of France is",
                                     max_tokens=5, temperature=0, logprobs=2)
    lp = comp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert "".join(lp.tokens) == comp.choices[0].text
    assert lp.text_offset[0] == 0 and all(len(t) <= 2 for t in lp.top_logprobs)


def test_completions_single_batch_and_stream(client):
    one = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8,
                                    temperature=0)
    assert one.object == "text_completion" and one.id.startswith("cmpl-")
    assert one.usage.completion_tokens == 8 and one.choices[0].finish_reason == "length"
    batch = client.completions.create(model=MODEL, prompt=["Once upon a time", "1, 2, 3,"],
                                      max_tokens=8, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.choices[0].text == one.choices[0].text
    streamed = {0: "", 1: ""}
    for chunk in client.completions.create(model=MODEL, prompt=["Once upon a time", "1, 2, 3,"],
                                           max_tokens=8, temperature=0, stream=True):
        for c in chunk.choices:
            streamed[c.index] += c.text
    assert [streamed[0], streamed[1]] == [c.text for c in batch.choices]
    # Without max_tokens: the server's --override-generation-config max_new_tokens (48 here;
    # without it, 16 as in OpenAI's legacy endpoint).
    default_len = client.completions.create(model=MODEL, prompt="Hello", temperature=0,
                                            extra_body={"ignore_eos": True})
    assert default_len.usage.completion_tokens == 48


def test_chinese_and_emoji_stream_without_broken_characters(client, server):
    messages = [{"role": "user", "content": "请用中文回答：你好吗？"}]
    full = client.chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                          max_tokens=40)
    deltas = [c.choices[0].delta.content for c in client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=40, stream=True)
        if c.choices and c.choices[0].delta.content]
    text = "".join(deltas)
    assert text == full.choices[0].message.content
    assert any("\u4e00" <= ch <= "\u9fff" for ch in text), text   # Chinese was generated
    assert all("\ufffd" not in d for d in deltas)
    comp = [c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="北京是中国的首都。上海是", max_tokens=24, temperature=0, stream=True)]
    assert any("\u4e00" <= ch <= "\u9fff" for ch in "".join(comp))
    assert all("\ufffd" not in d for d in comp)


def test_thinking_reaches_template_and_reasoning_is_split(client, server):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Why is the sky blue?"}],
              temperature=0, max_tokens=16)
    tmpl = {"chat_template": THINK_TEMPLATE}
    # enable_thinking, top level or in chat_template_kwargs, reaches the template.
    on = httpx.post(server.url("/tokenize"), json={
        "messages": kw["messages"], "chat_template_kwargs": {"enable_thinking": True}}).json()
    off = httpx.post(server.url("/tokenize"), json={"messages": kw["messages"]}).json()
    assert on["count"] == off["count"]   # the model's own template has no thinking switch
    raw = client.chat.completions.create(**kw, extra_body={**tmpl, "enable_thinking": True})
    split = client.chat.completions.create(**kw, extra_body={
        **tmpl, "chat_template_kwargs": {"enable_thinking": True}, "return_reasoning": True})
    raw_text = raw.choices[0].message.content
    assert raw_text and "</think>" not in raw_text
    # The prompt opened <think>: without </think> all of it is reasoning.
    assert split.choices[0].message.reasoning_content == raw_text
    assert split.choices[0].message.content == ""
    # Thinking off: the template does not open <think>; nothing is reasoning.
    no_think = client.chat.completions.create(**kw, extra_body={
        **tmpl, "enable_thinking": False, "return_reasoning": True})
    assert getattr(no_think.choices[0].message, "reasoning_content", None) is None
    assert no_think.choices[0].message.content
    # Streaming: the reasoning arrives as delta.reasoning_content.
    chunks = list(client.chat.completions.create(**kw, stream=True, extra_body={
        **tmpl, "enable_thinking": True, "return_reasoning": True}))
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or ""
                        for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert reasoning == raw_text and content == ""
    # Without return_reasoning the content is the text as generated (Open-AutoGLM parses it).
    plain = client.chat.completions.create(**kw, extra_body={**tmpl, "enable_thinking": True,
                                                            "return_reasoning": False})
    assert plain.choices[0].message.content == raw_text


def test_open_autoglm_request_shape(client):
    """Open-AutoGLM's client: streaming, its sampling fields, skip_special_tokens off."""
    messages = [{"role": "system", "content": "You operate a phone. Answer with do(action=...)."},
                {"role": "user", "content": [{"type": "text", "text": "Open the settings app."}]}]
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=24, temperature=0.0, top_p=0.85,
        frequency_penalty=0.2, extra_body={"skip_special_tokens": False}, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text
    # An image in a text-only model's request is refused with the reason.
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, max_tokens=4, messages=[{"role": "user",
            "content": [{"type": "text", "text": "what is this?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}])
    assert "does not accept image input" in err.value.body["message"]


def test_generation_config_defaults_are_overridden_by_request(client):
    """The server's generation config (max_new_tokens=48 here) fills what a request leaves
    out; what the request sets wins."""
    msgs = [{"role": "user", "content": "Hi"}]
    default = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0,
                                             extra_body={"ignore_eos": True})
    assert default.usage.completion_tokens == 48
    own = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0,
                                         max_tokens=5, extra_body={"ignore_eos": True})
    assert own.usage.completion_tokens == 5
    assert default.choices[0].message.content.startswith(own.choices[0].message.content)
    top = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=5,
                                         top_p=0.5, extra_body={"top_k": 5})
    assert top.choices[0].message.content == own.choices[0].message.content   # greedy wins


def test_tokenize_detokenize_roundtrip(server, tokenizer):
    r = httpx.post(server.url("/tokenize"), json={"prompt": "Hello 世界 👋"}).json()
    assert r["tokens"] == tokenizer.encode("Hello 世界 👋") and r["max_model_len"] == 2048
    assert r["count"] == len(r["tokens"])
    d = httpx.post(server.url("/detokenize"), json={"tokens": r["tokens"]}).json()
    assert d["prompt"] == "Hello 世界 👋"


def test_metrics_use_vllm_names(server, client):
    _greedy(client, "One more.", max_tokens=4)
    text = httpx.get(server.url("/metrics")).text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_count", "vllm:request_queue_time_seconds_sum",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:num_preemptions_total", "vllm:request_success_total",
                 'model_name="autoglm-phone-9b"', "vllm:cache_config_info",
                 "autoglm:kv_cache_tokens", "autoglm:max_concurrency"):
        assert name in text, name
    samples = server.metrics()
    assert metric(samples, "vllm:generation_tokens_total") >= 4
    assert metric(samples, "vllm:e2e_request_latency_seconds_count") >= 1
    assert metric(samples, "vllm:prefix_cache_hits_total") > 0   # repeated system prompt
    assert metric(samples, "autoglm:max_concurrency") > 1
