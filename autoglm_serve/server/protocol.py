"""Request and response bodies of the OpenAI-compatible API (field names of OpenAI and vLLM).

Requests allow unknown fields (clients such as LangChain send extras that vLLM ignores too);
values are checked here for type and shape, and by SamplingParams for ranges. Numbers are
strict (JSON's `true` or "0.5" is not a temperature, though pydantic's lax mode would take it)
and must be finite (Python's JSON reader takes `Infinity` and `NaN`); text must be valid
Unicode: a lone surrogate (JSON's "\ud800") cannot be tokenized or sent back.

Fields a client may send that we cannot honour yet (a non-empty `logit_bias`, a forced tool
choice, a JSON response format) are refused with 400 rather than silently ignored.
"""
from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictFloat,
                      StrictInt, WithJsonSchema, field_validator)

from autoglm_serve.sampling_params import MAX_LOGPROBS, SEED_MAX, SEED_MIN


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def _valid_unicode(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"text is not valid Unicode (a lone surrogate at character "
                         f"{exc.start})") from None
    return text


Text = Annotated[str, AfterValidator(_valid_unicode)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


# ---- chat messages ------------------------------------------------------------------------
class ImageURL(BaseModel):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class TextPart(BaseModel):
    type: Literal["text"]
    text: Text


class ImagePart(BaseModel):
    type: Literal["image_url"]
    image_url: ImageURL | str   # str: in the schema only; the validator makes it an ImageURL

    @field_validator("image_url", mode="before")
    @classmethod
    def _bare_string(cls, value):
        """Some clients send the URL itself instead of {"url": ...}."""
        return {"url": value} if isinstance(value, str) else value


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[ContentPart] | None = None
    name: Text | None = None
    reasoning_content: Text | None = None


class StreamOptions(BaseModel):
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False


class _SamplingFields(_Request):
    """Sampling fields common to both endpoints; None means "the model's default". The ranges
    are SamplingParams' own, here so that /openapi.json documents them (n's upper bound and
    max_tokens' room in the context depend on the server, checked later)."""
    model: str | None = None
    n: StrictInt = Field(1, ge=1)
    temperature: StrictFloat | None = Field(None, ge=0)
    top_p: StrictFloat | None = Field(None, gt=0, le=1)
    top_k: StrictInt | None = Field(None, ge=-1)   # -1 and 0: off
    min_p: StrictFloat | None = Field(None, ge=0, le=1)
    frequency_penalty: StrictFloat | None = Field(None, ge=-2, le=2)
    presence_penalty: StrictFloat | None = Field(None, ge=-2, le=2)
    repetition_penalty: StrictFloat | None = Field(None, gt=0)
    seed: StrictInt | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stop: Text | list[Text] | None = None
    stop_token_ids: list[Annotated[StrictInt, Field(ge=0)]] | None = None
    max_tokens: StrictInt | None = Field(None, ge=1)
    min_tokens: StrictInt = Field(0, ge=0)
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value):
        if value:
            raise ValueError("logit_bias is not supported by this server yet")
        return value


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text", "json_object", "json_schema"]

    @field_validator("type")
    @classmethod
    def _text_only(cls, value):
        if value != "text":
            raise ValueError(f"response_format {value!r} is not supported by this server yet "
                             "(only 'text')")
        return value


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: dict[str, Any]


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS)
    # Thinking: the AutoGLM deployment guides send these through extra_body.
    enable_thinking: StrictBool | None = None
    return_reasoning: StrictBool | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    response_format: ResponseFormat | None = None

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice_we_honour(cls, value):
        if value is not None and value not in ("none", "auto"):
            raise ValueError("forcing a tool call (tool_choice 'required' or a named function) "
                             "is not supported by this server yet")
        return value


# An empty prompt is refused after tokenizing ("the prompt is empty"); the schema says so too.
_PROMPT_SCHEMA = {"anyOf": [
    {"type": "string", "minLength": 1},
    {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
    {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
    {"type": "array", "minItems": 1, "items": {"type": "array", "minItems": 1,
                                               "items": {"type": "integer", "minimum": 0}}}]}


class CompletionRequest(_SamplingFields):
    prompt: Annotated[Text | list[Text] | list[StrictInt] | list[list[StrictInt]],
                      WithJsonSchema(_PROMPT_SCHEMA)]
    best_of: StrictInt | None = None
    logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: StrictBool = False
    add_special_tokens: StrictBool = True


class TokenizeRequest(_Request):
    model: str | None = None
    prompt: Text | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: StrictBool | None = None
    add_generation_prompt: StrictBool = True
    enable_thinking: StrictBool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: StrictBool = False


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[StrictInt]


# ---- responses ----------------------------------------------------------------------------
class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """Every 4xx and 5xx (errors.py): documented so, FastAPI's 422 never leaves the server."""
    error: ErrorBody


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class ResponseMessage(BaseModel):
    role: str = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list = Field(default_factory=list)


class ChatChoice(BaseModel):
    index: int
    message: ResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class CompletionLogprobs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
