"""Per-request sampling settings, with vLLM's field names and defaults.

Clients port their vLLM/OpenAI code unchanged, so names, defaults and the meaning of the
"off" values (top_k 0 or -1, top_p 1.0, min_p 0.0, repetition_penalty 1.0) follow vLLM.
Validation happens once here, so the sampler can trust every value it reads.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

from autoglm_serve.structured.spec import StructuredSpec

# Below this temperature sampling is treated as argmax; dividing by ~0 would overflow.
_GREEDY_EPS = 1e-5
# OpenAI caps top_logprobs at 20 and vLLM's default max_logprobs is 20.
MAX_LOGPROBS = 20
# OpenAI's range for a logit_bias value.
LOGIT_BIAS_MAX = 100.0
# vLLM's range for seed (a signed 64-bit integer); torch's generators take it modulo 2^64.
SEED_MIN, SEED_MAX = -2**63, 2**63 - 1


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0              # 0 = greedy
    top_p: float = 1.0                    # 1.0 = off
    top_k: int = 0                        # 0 or -1 = off
    min_p: float = 0.0                    # 0.0 = off
    frequency_penalty: float = 0.0        # OpenAI semantics, output tokens only
    presence_penalty: float = 0.0         # OpenAI semantics, output tokens only
    repetition_penalty: float = 1.0       # HF/vLLM semantics, prompt + output tokens
    seed: int | None = None
    stop: str | list[str] | None = None   # normalized to list[str]
    stop_token_ids: list[int] | None = None  # normalized to list[int]
    max_tokens: int | None = 16           # None = up to max_model_len, resolved by the engine
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None           # top-N logprobs; 0 = only the sampled token's
    prompt_logprobs: int | None = None    # the same for every prompt token but the first
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None   # token id -> added to its logit (OpenAI)
    structured: StructuredSpec | None = None     # output constrained by a grammar

    def __post_init__(self) -> None:
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = [] if self.stop_token_ids is None else list(self.stop_token_ids)
        if self.logit_bias is not None:
            self.logit_bias = dict(self.logit_bias) or None
        self._validate()

    def _validate(self) -> None:
        for name in ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty",
                     "repetition_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if not _is_int(self.n) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        if not self.temperature >= 0:  # written so NaN fails too
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or (self.top_k != -1 and self.top_k < 0):
            raise ValueError(f"top_k must be -1 (off), 0 (off) or a positive integer, got {self.top_k!r}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if not -2 <= self.frequency_penalty <= 2:
            raise ValueError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty!r}")
        if not -2 <= self.presence_penalty <= 2:
            raise ValueError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty!r}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")
        if self.seed is not None and (not _is_int(self.seed)
                                      or not SEED_MIN <= self.seed <= SEED_MAX):
            raise ValueError(f"seed must be an integer in [{SEED_MIN}, {SEED_MAX}] or None, "
                             f"got {self.seed!r}")
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            raise ValueError(f"max_tokens must be an integer >= 1 or None, got {self.max_tokens!r}")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be <= max_tokens ({self.max_tokens}), got {self.min_tokens!r}")
        if self.logprobs is not None and (
                not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise ValueError(
                f"logprobs must be an integer in [0, {MAX_LOGPROBS}] or None, got {self.logprobs!r}")
        if self.prompt_logprobs is not None and (
                not _is_int(self.prompt_logprobs)
                or not 0 <= self.prompt_logprobs <= MAX_LOGPROBS):
            raise ValueError(f"prompt_logprobs must be an integer in [0, {MAX_LOGPROBS}] or "
                             f"None, got {self.prompt_logprobs!r}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty strings, got {s!r}")
        for t in self.stop_token_ids:
            if not _is_int(t) or t < 0:
                raise ValueError(f"stop_token_ids must be non-negative integers, got {t!r}")

        for t, bias in (self.logit_bias or {}).items():
            if not _is_int(t) or t < 0:
                raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {t!r}")
            if not _is_number(bias) or not -LOGIT_BIAS_MAX <= bias <= LOGIT_BIAS_MAX:
                raise ValueError(f"logit_bias values must be numbers in [-100, 100], got {bias!r}")
        if self.structured is not None and not isinstance(self.structured, StructuredSpec):
            raise ValueError(f"structured must be a StructuredSpec, got {self.structured!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS or self.top_k == 1

    def clone(self) -> SamplingParams:
        """A deep copy, so the n children of one request can be given their own seeds/stops."""
        return copy.deepcopy(self)


def _is_number(x: object) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool))


def _is_int(x: object) -> bool:
    # bool is a subclass of int, but seed=True or n=False is a client bug, not a number.
    return isinstance(x, int) and not isinstance(x, bool)
