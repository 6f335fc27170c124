"""What the engine returns per request (the shape vLLM users know)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    logprob: float
    rank: int
    decoded_token: str | None = None


@dataclass
class RequestError:
    """Why the engine failed a request (its finish_reason is then "error")."""
    message: str
    out_of_memory: bool = False     # the same request may fit later (HTTP 503, not 500)


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None        # "stop" | "length" | "abort" | "error"
    stop_reason: str | int | None = None    # the stop string or token id that ended it
    logprobs: list[dict[int, Logprob]] | None = None   # per token: token id -> Logprob
    cumulative_logprob: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    extra: dict = field(default_factory=dict)
    error: RequestError | None = None       # set when the engine failed it
    # with SamplingParams.prompt_logprobs: per prompt token (None for the first)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
