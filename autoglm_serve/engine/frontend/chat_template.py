"""Chat messages → prompt text (through the model's chat template) + the images they carry.

The one renderer of the server and the offline LLM: messages are OpenAI-style dicts (content a
string, or a list of {"type": "text"} and {"type": "image_url"} parts). The two content formats
are vLLM's: "openai" hands the template each content list with image parts as {"type": "image"}
(the template places them); "string" joins a message's text parts with "\n" and puts one
placeholder per image before the text, each on its own line (what templates such as SmolLM's or
Llama's expect, and what Open-AutoGLM's vLLM command asks for).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class PromptError(ValueError):
    """A prompt that cannot be rendered; ``param`` names the request field at fault."""

    def __init__(self, message: str, param: str = "messages"):
        super().__init__(message)
        self.param = param


@dataclass
class ImageRef:
    url: str                 # http(s)://, data:image/...;base64,..., or file://
    detail: str | None = None
    message_index: int = 0


@dataclass
class RenderedPrompt:
    prompt: str
    images: list[ImageRef] = field(default_factory=list)


@dataclass(frozen=True)
class ContentFormat:
    """How this model's template takes content lists (content_format_for)."""
    name: str = "string"                  # "openai" | "string"
    image_placeholder: str | None = None  # what the string format writes for an image
    image_token: str | None = None        # the token each image must leave in the prompt


def content_format_for(requested: str, tokenizer, placeholder_ids: tuple[int, ...] | None
                       ) -> ContentFormat:
    """vLLM's "auto": content lists for a model that takes images, strings otherwise."""
    name = requested if requested != "auto" else ("openai" if placeholder_ids else "string")
    if not placeholder_ids or tokenizer is None:
        return ContentFormat(name)
    start, image, end = tokenizer.convert_ids_to_tokens(list(placeholder_ids))
    return ContentFormat(name, start + image + end, image)


def _image_url(part: dict) -> str:
    value = part.get("image_url")
    if isinstance(value, dict):
        value = value.get("url")
    if not isinstance(value, str) or not value:
        raise PromptError("image_url part needs a url: {'type': 'image_url', "
                          "'image_url': {'url': 'data:image/png;base64,...'}}")
    return value


def _message_for_template(msg: dict, index: int, images: list[ImageRef],
                          fmt: ContentFormat) -> dict[str, Any]:
    d = {k: v for k, v in msg.items() if v is not None}
    content = msg.get("content")
    if content is None:
        d["content"] = ""
    elif isinstance(content, list):
        texts: list[str] = []
        parts: list[dict[str, Any]] = []
        for part in content:
            kind = part.get("type")
            if kind == "text":
                texts.append(part["text"])
                parts.append({"type": "text", "text": part["text"]})
            elif kind == "image_url":
                detail = part["image_url"].get("detail") \
                    if isinstance(part.get("image_url"), dict) else None
                images.append(ImageRef(_image_url(part), detail, index))
                parts.append({"type": "image"})
            else:
                raise PromptError(f"messages[{index}]: unknown content part type {kind!r} "
                                  "(text and image_url are understood)")
        if fmt.name == "openai":
            d["content"] = parts
        else:
            text = "\n".join(texts)
            n_images = len(parts) - len(texts)
            if n_images and fmt.image_placeholder:
                # as vLLM: placeholders the text already has count, the rest go first
                missing = max(0, n_images - text.count(fmt.image_placeholder))
                text = "\n".join([fmt.image_placeholder] * missing + [text])
            d["content"] = text
    return d


def _check_images_placed(prompt: str, images: list[ImageRef], messages: list[dict],
                         image_token: str) -> None:
    """Each image needs its one image token in the prompt: a template that leaves an image out
    (GLM-4.1V's renders images in user turns only) is the request's error, said before the
    multimodal layer finds the mismatch."""
    placed = prompt.count(image_token)
    if placed == len(images):
        return
    where = sorted({(ref.message_index, messages[ref.message_index].get("role"))
                    for ref in images})
    roles = ", ".join(f"messages[{i}] ({role})" for i, role in where)
    raise PromptError(f"the chat template placed {placed} image token(s) {image_token!r} for "
                      f"{len(images)} image(s) (images in {roles}); this model's template "
                      "renders images in user messages only")


def render_chat(tokenizer, messages: list[dict], fmt: ContentFormat, *,
                chat_template: str | None = None,
                template_kwargs: dict[str, Any] | None = None,
                add_generation_prompt: bool = True,
                continue_final_message: bool = False,
                tools: list[dict[str, Any]] | None = None) -> RenderedPrompt:
    """Applies the chat template; raises PromptError for what the caller must fix."""
    if not messages:
        raise PromptError("messages must contain at least one message")
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if not template:
        raise PromptError("this model has no chat template: start the server with "
                          "--chat-template, or use /v1/completions")
    if continue_final_message and add_generation_prompt:
        raise PromptError("continue_final_message and add_generation_prompt cannot both be "
                          "true", "continue_final_message")
    images: list[ImageRef] = []
    dicts = [_message_for_template(m, i, images, fmt) for i, m in enumerate(messages)]
    try:
        prompt = tokenizer.apply_chat_template(
            dicts, chat_template=template, tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, tools=tools,
            **(template_kwargs or {}))
    except Exception as exc:  # a template's raise_exception() or a Jinja error
        raise PromptError(f"the chat template could not render these messages: {exc}") from exc
    if not isinstance(prompt, str):
        prompt = tokenizer.decode(prompt)
    if images and fmt.image_token:
        _check_images_placed(prompt, images, messages, fmt.image_token)
    return RenderedPrompt(prompt, images)
