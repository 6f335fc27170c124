"""Chat messages → prompt text (through the model's chat template) + the images they carry.

`render_messages` is the one seam between the API and multimodal input: it returns the prompt
text and the image references in prompt order; the multimodal layer turns those into engine
inputs. The two content formats are vLLM's: "openai" hands the template each content list with
image parts as {"type": "image"} (the template places them); "string" joins a message's text
parts with "\n" and puts one placeholder per image before the text, each on its own line (what
templates such as SmolLM's or Llama's expect, and what Open-AutoGLM's vLLM command asks for).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autoglm_serve.server.errors import bad_request
from autoglm_serve.server.protocol import ChatMessage, ImagePart, TextPart


@dataclass
class ImageRef:
    url: str                 # http(s)://, data:image/...;base64,..., or file://
    detail: str | None = None
    message_index: int = 0


@dataclass
class RenderedPrompt:
    prompt: str
    images: list[ImageRef] = field(default_factory=list)


def _message_dict(msg: ChatMessage, index: int, images: list[ImageRef], content_format: str,
                  image_placeholder: str | None) -> dict[str, Any]:
    d = msg.model_dump(exclude_none=True)
    content = msg.content
    if content is None:
        d["content"] = ""
    elif isinstance(content, list):
        texts: list[str] = []
        parts: list[dict[str, Any]] = []
        for part in content:
            if isinstance(part, TextPart):
                texts.append(part.text)
                parts.append({"type": "text", "text": part.text})
            elif isinstance(part, ImagePart):
                images.append(ImageRef(part.image_url.url, part.image_url.detail, index))
                parts.append({"type": "image"})
        if content_format == "openai":
            d["content"] = parts
        else:
            text = "\n".join(texts)
            n_images = len(parts) - len(texts)
            if n_images and image_placeholder:
                # as vLLM: placeholders the text already has count, the rest go first
                missing = max(0, n_images - text.count(image_placeholder))
                text = "\n".join([image_placeholder] * missing + [text])
            d["content"] = text
    return d


def _check_images_placed(prompt: str, images: list[ImageRef], messages: list[ChatMessage],
                         image_token: str) -> None:
    """Each image needs its one image token in the prompt: a template that leaves an image out
    (GLM-4.1V's renders images in user turns only) is the request's error, said before the
    multimodal layer finds the mismatch."""
    placed = prompt.count(image_token)
    if placed == len(images):
        return
    where = sorted({(ref.message_index, messages[ref.message_index].role) for ref in images})
    roles = ", ".join(f"messages[{i}] ({role})" for i, role in where)
    raise bad_request(f"the chat template placed {placed} image token(s) {image_token!r} for "
                      f"{len(images)} image(s) (images in {roles}); this model's template "
                      "renders images in user messages only", "messages")


def render_messages(tokenizer, messages: list[ChatMessage], *,
                    chat_template: str | None = None,
                    template_kwargs: dict[str, Any] | None = None,
                    add_generation_prompt: bool = True,
                    continue_final_message: bool = False,
                    tools: list[dict[str, Any]] | None = None,
                    content_format: str = "string", image_placeholder: str | None = None,
                    image_token: str | None = None) -> RenderedPrompt:
    """Applies the chat template. `content_format`: "openai" or "string" (vLLM's meanings);
    `image_placeholder`: what the string format writes for an image; `image_token`: the token
    each image must leave in the prompt (both None for a model without images)."""
    if not messages:
        raise bad_request("messages must contain at least one message", "messages")
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if not template:
        raise bad_request("this model has no chat template: start the server with "
                          "--chat-template, or use /v1/completions", "messages")
    if continue_final_message and add_generation_prompt:
        raise bad_request("continue_final_message and add_generation_prompt cannot both be "
                          "true", "continue_final_message")
    images: list[ImageRef] = []
    dicts = [_message_dict(m, i, images, content_format, image_placeholder)
             for i, m in enumerate(messages)]
    try:
        prompt = tokenizer.apply_chat_template(
            dicts, chat_template=template, tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, tools=tools,
            **(template_kwargs or {}))
    except Exception as exc:  # a template's raise_exception() or a Jinja error
        raise bad_request(f"the chat template could not render these messages: {exc}",
                          "messages") from exc
    if not isinstance(prompt, str):
        prompt = tokenizer.decode(prompt)
    if images and image_token:
        _check_images_placed(prompt, images, messages, image_token)
    return RenderedPrompt(prompt, images)
