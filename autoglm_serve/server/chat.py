"""Chat messages → prompt text (through the model's chat template) + the images they carry.

`render_messages` is the one seam between the API and multimodal input: it returns the prompt
text and the image references in prompt order; the multimodal layer turns those into engine
inputs. Text-only templates get each message's text parts joined into one string (vLLM's
"string" content format), which is what templates such as SmolLM's or Llama's expect.
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


def _message_dict(msg: ChatMessage, index: int, images: list[ImageRef],
                  keep_parts: bool) -> dict[str, Any]:
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
        # Multimodal templates place image tokens where {"type": "image"} parts are.
        d["content"] = parts if keep_parts else "\n".join(texts)
    return d


def render_messages(tokenizer, messages: list[ChatMessage], *,
                    chat_template: str | None = None,
                    template_kwargs: dict[str, Any] | None = None,
                    add_generation_prompt: bool = True,
                    continue_final_message: bool = False,
                    tools: list[dict[str, Any]] | None = None,
                    content_as_parts: bool = False) -> RenderedPrompt:
    """Applies the chat template. `content_as_parts`: the template understands OpenAI-style
    content lists (multimodal models); otherwise text parts are joined into one string."""
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
    dicts = [_message_dict(m, i, images, content_as_parts) for i, m in enumerate(messages)]
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
    return RenderedPrompt(prompt, images)
