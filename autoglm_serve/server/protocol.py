"""Request and response bodies of the OpenAI-compatible API (field names of OpenAI and vLLM).

Requests allow unknown fields (clients such as LangChain send extras that vLLM ignores too);
values are checked here for type and shape, and by SamplingParams for ranges. Numbers are
strict (JSON's `true` or "0.5" is not a temperature, though pydantic's lax mode would take it)
and must be finite (Python's JSON reader takes `Infinity` and `NaN`); text must be valid
Unicode: a lone surrogate (JSON's "\ud800") cannot be tokenized or sent back.

Structured outputs come as OpenAI's `response_format`, vLLM's `structured_outputs` or its
older `guided_*` fields (server/structured_request.py turns them into one spec); tools as
OpenAI's `tools` and `tool_choice` (server/tools.py).
"""
from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictFloat,
                      StrictInt, WithJsonSchema, field_validator, model_serializer)

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
    # token id (as a JSON key) -> bias in [-100, 100], added to its logit (OpenAI)
    logit_bias: dict[str, StrictFloat | StrictInt] | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, value):
        for key, bias in (value or {}).items():
            if not key.isdigit():
                raise ValueError(f"logit_bias keys must be token ids, got {key!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {bias!r}")
        return value


class StructuredOutputs(BaseModel):
    """vLLM's structured_outputs (one of them), and our knob for the action grammar."""
    model_config = ConfigDict(extra="forbid")
    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None           # EBNF, or a built-in name: "autoglm_action"
    json_object: StrictBool | None = None
    max_text_chars: StrictInt | None = Field(None, ge=1)   # autoglm_action's string bound


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class FunctionName(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: FunctionName


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class Tool(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


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
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    response_format: ResponseFormat | None = None


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


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCallItem(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ResponseMessage(BaseModel):
    role: str = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallItem] = Field(default_factory=list)
    # the autoglm_action grammar's answer, parsed as Open-AutoGLM does
    # ({"_metadata": "do", "action": "Tap", "element": [x, y]}); left out of other responses
    action: dict[str, Any] | None = None

    @model_serializer(mode="wrap")
    def _without_absent_action(self, handler):
        # OpenAI's message has no such field: only the action grammar's responses carry it
        data = handler(self)
        if data.get("action") is None:
            data.pop("action", None)
        return data


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


# ---- the Responses API (POST /v1/responses; serving_responses.py) ---------------------------
class ResponsesText(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["input_text", "output_text"]
    text: Text


class ResponsesImage(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["input_image"]
    image_url: str
    detail: Literal["auto", "low", "high"] | None = None


ResponsesContentPart = Annotated[ResponsesText | ResponsesImage, Field(discriminator="type")]


class ResponsesMessageItem(_Request):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Text | list[ResponsesContentPart]


class ResponsesFunctionCallItem(_Request):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: Text


class ResponsesFunctionOutputItem(_Request):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: Text


class ResponsesReasoningItem(_Request):
    """An earlier turn's reasoning sent back: chat templates drop it, so it is read and left."""
    type: Literal["reasoning"]


def _typed_item(item):
    """OpenAI's short form of a message ({role, content}) has no type."""
    if isinstance(item, dict) and "type" not in item and "role" in item:
        return {**item, "type": "message"}
    return item


ResponsesInputItem = Annotated[
    ResponsesMessageItem | ResponsesFunctionCallItem | ResponsesFunctionOutputItem
    | ResponsesReasoningItem, Field(discriminator="type")]


class ResponsesFunctionTool(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"]
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class ResponsesNamedToolChoice(BaseModel):
    type: Literal["function"]
    name: str


class ResponsesReasoning(BaseModel):
    model_config = ConfigDict(extra="allow")
    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesTextFormat(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: StrictBool | None = None


class ResponsesTextConfig(BaseModel):
    model_config = ConfigDict(extra="allow")
    format: ResponsesTextFormat | None = None


class ResponsesRequest(_Request):
    """OpenAI's Responses request without stored state (no previous_response_id). Fields of
    the chat endpoint that vLLM also takes here (top_k, penalties, seed, stop,
    chat_template_kwargs, ...) may come as extras and are checked as there."""
    model: str | None = None
    input: Text | list[ResponsesInputItem] = Field(min_length=1)
    instructions: Text | None = None
    max_output_tokens: StrictInt | None = Field(None, ge=1)
    temperature: StrictFloat | None = Field(None, ge=0)
    top_p: StrictFloat | None = Field(None, gt=0, le=1)
    stream: StrictBool = False
    tools: list[ResponsesFunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ResponsesNamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    reasoning: ResponsesReasoning | None = None
    text: ResponsesTextConfig | None = None
    store: StrictBool | None = None
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _short_messages(cls, value):
        return [_typed_item(i) for i in value] if isinstance(value, list) else value
