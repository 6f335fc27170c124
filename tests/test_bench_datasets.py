"""Datasets of autoglm_serve.bench: random, JSONL, ShareGPT, and the phone-agent episodes."""

from __future__ import annotations

import base64
import io
import json

import pytest
from PIL import Image

from autoglm_serve.bench.datasets import load_dataset, random_dataset
from autoglm_serve.bench.phone_agent import (
    SYSTEM_PROMPT, PhoneAgentWorkload, fallback_reply, image_count,
)
from autoglm_serve.bench.screenshots import HEIGHT, WIDTH, screenshot_png_base64


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from tests.tiny_llama import build_tiny_llama

    path = build_tiny_llama(tmp_path_factory.mktemp("tok") / "tiny-llama")
    return AutoTokenizer.from_pretrained(path)


def test_random_dataset_lengths_with_tokenizer(tokenizer):
    reqs = random_dataset(20, input_len=40, output_len=10, range_ratio=0.5, tokenizer=tokenizer,
                          seed=1)
    assert len(reqs) == 20
    for r in reqs:
        assert 20 <= r.prompt_len <= 60 and 5 <= r.output_len <= 15
        assert r.prompt_token_ids is not None and len(r.prompt_token_ids) == r.prompt_len
        assert not set(r.prompt_token_ids) & set(tokenizer.all_special_ids)
        # Word-level tokenizer: the text re-tokenizes to exactly the sampled length.
        assert len(tokenizer.encode(r.prompt, add_special_tokens=False)) == r.prompt_len
    assert len({r.prompt_len for r in reqs}) > 1  # the range ratio varies lengths
    # Same seed, same prompts.
    again = random_dataset(20, 40, 10, 0.5, tokenizer, seed=1)
    assert [r.prompt for r in again] == [r.prompt for r in reqs]


def test_random_dataset_without_tokenizer_counts_words():
    reqs = random_dataset(3, input_len=12, output_len=4)
    assert all(len(r.prompt.split()) == 12 == r.prompt_len and r.output_len == 4 for r in reqs)


def test_jsonl_dataset(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join([
        json.dumps({"prompt": "open the camera app", "output_len": 7}),
        json.dumps({"messages": [{"role": "user", "content": "tap the button"}]}),
        "",
    ]))
    reqs = load_dataset(str(path), num_prompts=5, input_len=0, output_len=None, seed=0)
    assert len(reqs) == 5  # cycles through the file
    by_prompt = {r.prompt: r for r in reqs}
    assert by_prompt["open the camera app"].output_len == 7
    assert by_prompt["tap the button"].messages == [{"role": "user", "content": "tap the button"}]
    assert by_prompt["tap the button"].output_len == 128
    # --output-len overrides the file.
    assert {r.output_len for r in load_dataset(str(path), 2, 0, output_len=3)} == {3}


def test_sharegpt_dataset_filters_as_vllm(tmp_path):
    path = tmp_path / "sharegpt.json"
    long_reply = " ".join(["word"] * 30)
    path.write_text(json.dumps([
        {"conversations": [{"from": "human", "value": "please open the phone settings now"},
                           {"from": "gpt", "value": long_reply}]},
        {"conversations": [{"from": "human", "value": "hi"},  # prompt under 4 tokens: dropped
                           {"from": "gpt", "value": long_reply}]},
        {"conversations": [{"from": "human", "value": "only one turn here"}]},  # dropped
    ]))
    reqs = load_dataset(str(path), num_prompts=3, input_len=0, output_len=None)
    assert {r.prompt for r in reqs} == {"please open the phone settings now"}
    assert all(r.output_len == 30 and r.prompt_len == 6 for r in reqs)


def test_unknown_dataset_is_a_clear_error():
    with pytest.raises(ValueError, match="not 'random'"):
        load_dataset("no-such-file.jsonl", 1, 1, 1)


def test_screenshot_is_a_1080x2400_png_and_varies_per_step():
    shots = [screenshot_png_base64(0, agent=0, step=s) for s in range(3)]
    for b64 in shots:
        raw = base64.b64decode(b64)
        assert raw[:8] == b"\x89PNG\r\n\x1a\n"
        img = Image.open(io.BytesIO(raw))
        assert img.format == "PNG" and img.size == (WIDTH, HEIGHT) == (1080, 2400)
        assert img.mode == "RGBA"      # what adb screencap writes and Open-AutoGLM passes on
        assert 50_000 < len(raw) < 4_000_000  # a realistic screenshot size
    assert len(set(shots)) == 3
    assert screenshot_png_base64(0, 0, 1) == shots[1]  # deterministic
    assert screenshot_png_base64(0, 1, 1) != shots[1]  # another agent sees another screen


def test_phone_agent_screenshots_rendered_in_processes_are_the_ones_drawn_here():
    workload = PhoneAgentWorkload(agents=3, steps=3, seed=3)     # 8 to draw: the process pool
    counted = []
    workload.screenshots[(1, 1)] = "kept"
    workload.prepare(counted.append)
    assert sum(counted) == 9 and workload.screenshots[(1, 1)] == "kept"
    for (agent, step), shot in workload.screenshots.items():
        if (agent, step) != (1, 1):
            assert shot == screenshot_png_base64(3, agent, step), (agent, step)


def test_phone_agent_history_grows_and_keeps_only_the_latest_image():
    wl = PhoneAgentWorkload(agents=1, steps=3, seed=0)
    wl.prepare()
    assert len(wl.screenshots) == 3
    assert 2000 <= len(SYSTEM_PROMPT) <= 8000  # "a few thousand characters"
    ep = wl.episode(0)
    sizes, sent = [], []
    for step in range(3):
        messages = ep.add_screen(step, wl.screenshots[(0, step)])
        sent.append(messages)
        # Exactly one image per request, in the newest user turn.
        assert image_count(messages) == 1
        last = messages[-1]
        assert last["role"] == "user"
        url = last["content"][0]["image_url"]["url"]
        assert url == "data:image/png;base64," + wl.screenshots[(0, step)]
        sizes.append(ep.text_chars())
        ep.add_reply(fallback_reply(0, step))
    assert [m["role"] for m in sent[0]] == ["system", "user"]
    assert [m["role"] for m in sent[2]] == ["system", "user", "assistant", "user", "assistant",
                                            "user"]
    assert sizes[0] < sizes[1] < sizes[2]  # the text history grows
    assert wl.episode(0).task in sent[0][1]["content"][1]["text"]  # the task comes at step 0
    # Earlier turns lost their images but kept their text.
    for m in sent[2][1:-1]:
        if m["role"] == "user":
            assert [p["type"] for p in m["content"]] == ["text"]
    # The messages sent are snapshots: later steps do not rewrite what step 0 sent.
    assert image_count(sent[0]) == 1


def test_load_tokenizer_never_reaches_for_a_hub(tmp_path, monkeypatch):
    """A model name not on this machine gives no tokenizer without a single connection
    attempt (the bench used to spend ~30 s in hub retries); a local path loads."""
    import socket

    from autoglm_serve.bench.datasets import load_tokenizer
    from tests.tiny_llama import build_tiny_llama

    attempts = []
    real_connect, real_getaddrinfo = socket.socket.connect, socket.getaddrinfo

    def connect(self, address):
        attempts.append(address)
        return real_connect(self, address)

    def getaddrinfo(host, *args, **kwargs):
        attempts.append(host)
        return real_getaddrinfo(host, *args, **kwargs)
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert load_tokenizer("zai-org/AutoGLM-Phone-9B-not-cached") is None
    assert attempts == []
    path = build_tiny_llama(tmp_path / "tiny-llama")
    assert load_tokenizer(str(path)).encode("hello world")
