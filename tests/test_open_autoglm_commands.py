"""Open-AutoGLM's recommended vLLM and SGLang command lines, unchanged but for the module name
and a local checkpoint (the tiny random GLM-4.1V), start our server, which then serves an agent
step with a screenshot as Open-AutoGLM sends it."""
from __future__ import annotations

import base64
import io
from pathlib import Path

import httpx
import pytest
from openai import OpenAI
from PIL import Image

from tests.glm4v_fixtures import make_tiny_glm4v
from tests.server_fixtures import ServerProcess

SCREENSHOT = Path("/work/shared/data/phone_screenshot_1080x2400.png")
SYSTEM = "You are a phone agent. Answer with <think>...</think><answer>...</answer>."
TASK = "** Screen Info **\n\n{\"current_app\": \"System Home\"}\n\nTask: open Settings"
PLACEHOLDER = "<|begin_of_image|><|image|><|end_of_image|>"


def vllm_line(model: Path) -> list[str]:
    return ["--served-model-name", "autoglm-phone-9b", "--allowed-local-media-path", "/",
            "--mm-encoder-tp-mode", "data", "--mm_processor_cache_type", "shm",
            "--mm_processor_kwargs", '{"max_pixels":5000000}', "--max-model-len", "25480",
            "--chat-template-content-format", "string", "--limit-mm-per-prompt",
            '{"image":10}', "--model", str(model), "--port", "8000"]


def sglang_line(model: Path) -> list[str]:
    return ["--model-path", str(model), "--served-model-name", "autoglm-phone-9b",
            "--context-length", "25480", "--mm-enable-dp-encoder",
            "--mm-process-config", '{"image":{"max_pixels":5000000}}', "--port", "8000"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    # GLM-4.1V's 65536 positions, so that the commands' 25480-token context fits
    return make_tiny_glm4v(tmp_path_factory.mktemp("tiny-glm4v"), max_position_embeddings=65536)


@pytest.fixture(scope="module")
def screenshot_url():
    # the sample screenshot at a quarter of its size: the tiny ViT stays quick at max_pixels 5M
    img = Image.open(SCREENSHOT).convert("RGB").resize((270, 600))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def agent_messages(url: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": TASK}]}]


def agent_step(server: ServerProcess, url: str):
    client = OpenAI(base_url=server.url("/v1"), api_key="EMPTY", max_retries=0)
    # Open-AutoGLM's sampling fields (max_tokens cut from its 3000 for a CPU test)
    return client.chat.completions.create(
        model="autoglm-phone-9b", messages=agent_messages(url), temperature=0.0, top_p=0.85,
        frequency_penalty=0.2, max_tokens=24, stream=True)


def prompt_ids(server: ServerProcess, url: str) -> list[int]:
    r = httpx.post(server.url("/tokenize"), json={"model": "autoglm-phone-9b",
                                                   "messages": agent_messages(url)}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_vllm_command_line(model, screenshot_url):
    from transformers import AutoTokenizer

    with ServerProcess(vllm_line(model), module="autoglm_serve.entrypoints.openai.api_server",
                       subcommand=None) as server:
        chunks = list(agent_step(server, screenshot_url))
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        # the string content format: the image's placeholder on its own line before the text
        want = (f"[gMASK]<sop><|system|>\n{SYSTEM}<|user|>\n{PLACEHOLDER}\n{TASK}"
                "<|assistant|>\n")
        tokenizer = AutoTokenizer.from_pretrained(model)
        assert prompt_ids(server, screenshot_url) == tokenizer(
            want, add_special_tokens=False)["input_ids"]
        log = server.log(200_000)
        assert "--mm-processor-cache-type shm: accepted, no effect here" in log


def test_sglang_command_line(model, screenshot_url):
    with ServerProcess(sglang_line(model), module="autoglm_serve.launch_server",
                       subcommand=None) as server:
        chunks = list(agent_step(server, screenshot_url))
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        info = httpx.get(server.url("/v1/models"), timeout=10).json()["data"][0]
        assert info["id"] == "autoglm-phone-9b" and info.get("max_model_len") in (None, 25480)
