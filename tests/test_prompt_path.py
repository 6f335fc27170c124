"""One prompt path: the offline LLM renders chats with the server's renderer
(engine/frontend/chat_template.py) and applies the checkpoint's generation defaults, as the server does."""
from __future__ import annotations

import base64
import io
import json

import pytest
import torch
from PIL import Image

from autoglm_serve import LLM
from autoglm_serve.engine.frontend.chat_template import PromptError
from tests.glm4v_fixtures import make_tiny_glm4v


def png_url(w=56, h=84) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (30, 120, 200)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    torch.set_num_threads(2)
    path = make_tiny_glm4v(tmp_path_factory.mktemp("tiny-glm4v"))
    (path / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.3, "top_p": 0.7, "eos_token_id": [0]}))
    return LLM(str(path), dtype="float32", max_model_len=2048,
               mm_processor_kwargs={"max_pixels": 20_000})


def test_offline_refuses_an_image_the_template_drops(glm):
    """GLM-4.1V's template renders images in user turns only: the offline chat says so, as
    the server's 400 does, instead of failing later on a placeholder count."""
    messages = [{"role": "system", "content": [{"type": "image_url",
                                                "image_url": {"url": png_url()}}]},
                {"role": "user", "content": "tap"}]
    with pytest.raises(PromptError, match=r"messages\[0\] \(system\)"):
        glm.chat(messages)


def test_offline_and_server_render_alike(glm):
    """The content format of the server's default ("auto": content lists for a vision model)
    places the image where the template says; the prompt expands it to its patches."""
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": png_url()}},
                                             {"type": "text", "text": "open settings"}]}]
    rendered = glm.engine.frontend.render_chat(messages)
    assert "<|begin_of_image|><|image|><|end_of_image|>open settings" in rendered.prompt
    prompt = glm.engine.frontend.prepare_rendered(rendered)
    assert len(prompt.mm_items) == 1 and prompt.mm_items[0].length > 1


def test_offline_applies_the_generation_config(glm):
    params = glm.get_default_sampling_params()
    assert (params.temperature, params.top_p) == (0.3, 0.7)
