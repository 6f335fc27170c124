"""Screenshots through the real server on a tiny random GLM-4.1V checkpoint: data URLs,
file:// policy, limits, image-aware prefix caching and the encoder cache, and an Open-AutoGLM
shaped agent loop with the openai SDK."""
import base64
import io
import os
import re
import time

import httpx
import numpy as np
import pytest
import torch
from openai import OpenAI
from PIL import Image

from tests.glm4v_fixtures import make_tiny_glm4v
from tests.server_fixtures import ServerProcess

MAX_PIXELS = 60_000     # keeps the tiny ViT quick on a CPU; uploads are full size


def png_url(img: Image.Image) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def screenshot(seed: int, w=1080, h=2400) -> Image.Image:
    rng = np.random.default_rng(seed)
    img = np.full((h, w, 3), 240, np.uint8)
    for _ in range(12):   # a few "widgets" so screenshots differ
        x, y = rng.integers(0, w - 200), rng.integers(0, h - 200)
        img[y:y + 150, x:x + 180] = rng.integers(0, 255, 3)
    return Image.fromarray(img)


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("media")
    screenshot(7, 540, 1200).save(d / "shot.png")
    outside = tmp_path_factory.mktemp("outside")
    screenshot(8, 540, 1200).save(outside / "secret.png")
    os.symlink(outside / "secret.png", d / "link.png")
    return d


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_tiny_glm4v(tmp_path_factory.mktemp("tiny-glm4v"))


@pytest.fixture(scope="module")
def server(model, media_dir):
    with ServerProcess([str(model), "--served-model-name", "autoglm-phone-9b",
                        "--max-model-len", "4096", "--allowed-local-media-path", str(media_dir),
                        "--limit-mm-per-prompt", '{"image": 2}',
                        "--mm-processor-kwargs", f'{{"max_pixels": {MAX_PIXELS}}}']) as srv:
        yield srv


def chat(server, content, **extra):
    body = {"model": "autoglm-phone-9b", "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": content}], **extra}
    return httpx.post(server.url("/v1/chat/completions"), json=body, timeout=120)


def image_part(url):
    return {"type": "image_url", "image_url": {"url": url}}


def metric(server, name) -> float:
    text = httpx.get(server.url("/metrics"), timeout=10).text
    m = re.search(rf"^{re.escape(name)}(?:_total)?(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def healthy(server):
    r = chat(server, "hello")
    assert r.status_code == 200, r.text


def test_data_url_screenshot_answers(server):
    r = chat(server, [image_part(png_url(screenshot(1))), {"type": "text", "text": "tap ok"}])
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "length"
    # the prompt counts the image's tokens: far more than the few text tokens
    assert body["usage"]["prompt_tokens"] > 40


def test_a_screenshot_crosses_to_the_core_process_and_answers_as_in_process(server, model):
    """The core runs in its own process; the screenshot (large enough to go as shared memory)
    reaches it intact and is resized and laid out there, so the answer equals the in-process
    engine's."""
    from autoglm_serve import LLM, SamplingParams
    from autoglm_serve.engine.process.tensor_channel import SHARE_MIN_BYTES

    assert server.core_pid() not in (None, server.proc.pid)
    content = [image_part(png_url(screenshot(21))), {"type": "text", "text": "tap ok"}]
    r = chat(server, content, max_tokens=6, logprobs=True)
    assert r.status_code == 200, r.text
    body = r.json()
    assert "action" not in body["choices"][0]["message"]    # the action grammar's field only
    llm = LLM(str(model), dtype="float32", max_model_len=4096,
              mm_processor_kwargs={"max_pixels": MAX_PIXELS})
    prompt = llm.engine.frontend.prepare_chat([{"role": "user", "content": content}])
    pixels = prompt.mm_items[0].pixel_values     # what crosses: the RGB image at its own size
    assert pixels.dtype == torch.uint8 and pixels.shape == (2400, 1080, 3)
    assert pixels.nbytes >= SHARE_MIN_BYTES
    assert body["usage"]["prompt_tokens"] == len(prompt.token_ids)
    offline = llm.chat([{"role": "user", "content": content}],
                       SamplingParams(temperature=0, max_tokens=6))[0].outputs[0]
    assert body["choices"][0]["message"]["content"] == offline.text
    assert len(body["choices"][0]["logprobs"]["content"]) == len(offline.token_ids) == 6


def test_bare_string_image_url_form(server):
    r = chat(server, [{"type": "image_url", "image_url": png_url(screenshot(2))},
                      {"type": "text", "text": "where"}])
    assert r.status_code == 200, r.text


def test_file_urls_inside_the_allowed_path_only(server, media_dir):
    ok = chat(server, [image_part(f"file://{media_dir / 'shot.png'}")])
    assert ok.status_code == 200, ok.text
    for url in (f"file://{media_dir}/../outside/secret.png", f"file://{media_dir / 'link.png'}",
                "file:///etc/passwd"):
        r = chat(server, [image_part(url)])
        assert r.status_code == 400, (url, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error"
        healthy(server)


@pytest.mark.parametrize("content,needle", [
    ([image_part(png_url(screenshot(i))) for i in range(3)], "at most 2 images"),
    ([image_part("data:image/png;base64,AAAAbm90IGFuIGltYWdl")], "image"),
    ([image_part("data:image/png;base64,%%%notbase64")], "base64"),
    ([image_part("http://127.0.0.1:9/x.png")], "disabled"),
    ([image_part(png_url(Image.new("RGB", (10, 5000))))], "aspect ratio"),   # once a 500
])
def test_bad_images_are_400_and_the_server_keeps_serving(server, content, needle):
    r = chat(server, content)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]
    healthy(server)


def test_decompression_bomb_is_refused(server):
    # a PNG whose header claims 20000 x 20000 pixels (400 M): refused before decoding
    bomb = Image.new("L", (20000, 20000))
    buf = io.BytesIO()
    bomb.save(buf, format="PNG", optimize=True)
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    r = chat(server, [image_part(url)])
    assert r.status_code == 400 and "pixel" in r.json()["error"]["message"]
    healthy(server)


def test_prefix_cache_and_encoder_cache_see_the_image(server):
    text = {"type": "text", "text": "open the settings app and turn on wifi " * 4}
    a, b = png_url(screenshot(11)), png_url(screenshot(12))
    hits0 = metric(server, "autoglm:encoder_cache_hits")
    first = chat(server, [image_part(a), text]).json()
    other = chat(server, [image_part(b), text]).json()
    # same text, different screenshot: nothing after the image is shared
    image_start = 5   # [gMASK] <sop> <|user|> \n <|begin_of_image|>
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] <= image_start + 16
    assert metric(server, "autoglm:encoder_cache_hits") == hits0
    again = chat(server, [image_part(a), text]).json()
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= first["usage"]["prompt_tokens"] - 16     # all but the last partial block
    assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    # a new question about the same screenshot: the prefix stops at the text, the ViT is skipped
    follow = chat(server, [image_part(a), {"type": "text", "text": "now go back"}]).json()
    assert follow["choices"][0]["finish_reason"] == "length"
    assert metric(server, "autoglm:encoder_cache_hits") >= hits0 + 1


SYSTEM_PROMPT = ("You are a phone operating agent. Each step you receive a screenshot of the "
                 "phone and the task. Think, then answer with one action such as "
                 "do(action=\"Tap\", element=[x, y]) or finish(message=\"...\"). ") * 10


def test_grafana_encoder_cache_panels_match_served_metrics(server):
    from tests.test_grafana_dashboard import ENCODER_CACHE, dashboard_metric_names, served_names
    served = served_names(httpx.get(server.url("/metrics"), timeout=10).text)
    assert ENCODER_CACHE <= dashboard_metric_names() and ENCODER_CACHE <= served


def test_agent_protocol_five_steps_streaming(server):
    """Requests shaped as Open-AutoGLM sends them: streaming, temperature 0, top_p 0.85,
    frequency_penalty 0.2, a long system prompt, one screenshot per step before the text,
    earlier screenshots removed from the history."""
    client = OpenAI(base_url=server.url("/v1"), api_key="EMPTY", timeout=120)
    history = [{"role": "system", "content": SYSTEM_PROMPT}]
    ttfts = []
    for step in range(5):
        for msg in history:   # the client drops earlier images
            if isinstance(msg["content"], list):
                msg["content"] = [p for p in msg["content"] if p["type"] == "text"]
        history.append({"role": "user", "content": [
            image_part(png_url(screenshot(100 + step))),
            {"type": "text", "text": f"Task: open settings. Step {step}."}]})
        start = time.monotonic()
        first, text = None, ""
        stream = client.chat.completions.create(
            model="autoglm-phone-9b", messages=history, stream=True, temperature=0, top_p=0.85,
            frequency_penalty=0.2, max_tokens=12)
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.monotonic()
                text += chunk.choices[0].delta.content
        assert first is not None and text
        ttfts.append(first - start)
        history.append({"role": "assistant", "content": text})
    assert len(ttfts) == 5 and all(t > 0 for t in ttfts)
    print("agent TTFT per step (s):", [round(t, 3) for t in ttfts])


def tokenize_messages(server, messages):
    r = httpx.post(server.url("/tokenize"), json={"model": "autoglm-phone-9b",
                                                   "messages": messages}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_default_content_format_is_the_templates_placement(server, model):
    """vLLM's "auto" is "openai" for GLM-4.1V's template: the image part becomes the template's
    placeholder, directly followed by the text (transformers' rendering of the same list)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    got = tokenize_messages(server, [{"role": "user", "content": [
        image_part(png_url(screenshot(3, 270, 600))), {"type": "text", "text": "tap it"}]}])
    want = "[gMASK]<sop><|user|>\n<|begin_of_image|><|image|><|end_of_image|>tap it<|assistant|>\n"
    assert got == tokenizer(want, add_special_tokens=False)["input_ids"]


def test_image_in_a_system_message_is_400(server):
    """GLM-4.1V's template renders images in user turns only: an image in a system turn is the
    request's error (param "messages"), not a 500."""
    body = {"model": "autoglm-phone-9b", "max_tokens": 2, "messages": [
        {"role": "system", "content": [image_part(png_url(screenshot(4, 270, 600))),
                                       {"type": "text", "text": "you are an agent"}]},
        {"role": "user", "content": "go"}]}
    client = OpenAI(base_url=server.url("/v1"), api_key="none", max_retries=0)
    with pytest.raises(Exception) as info:
        client.chat.completions.create(**body)
    err = info.value
    assert getattr(err, "status_code", None) == 400, err
    assert err.body["param"] == "messages" and "messages[0] (system)" in err.body["message"]
    healthy(server)
