"""Prompt → engine Requests: tokenization, validation, limits, per-request seeds."""
from __future__ import annotations

from dataclasses import dataclass, field

from autoglm_serve.engine.core.request import Request
from autoglm_serve.multimodal.inputs import MultiModalItem
from autoglm_serve.sampling_params import SamplingParams


@dataclass
class PreparedPrompt:
    """A prompt ready for the engine: token ids (images expanded) and what goes with them."""
    token_ids: list[int]
    text: str | None = None
    mm_items: list[MultiModalItem] = field(default_factory=list)
    mrope: tuple | None = None      # (positions [3, L], delta) for M-RoPE models with images


def child_id(parent_id: str, index: int, n: int) -> str:
    return parent_id if n == 1 else f"{index}_{parent_id}"


class InputProcessor:
    def __init__(self, tokenizer, max_model_len: int, vocab_size: int, eos_token_ids: set[int]):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.eos_token_ids = frozenset(eos_token_ids)

    def tokenize(self, prompt: str | list[int], add_special_tokens: bool = True) -> list[int]:
        """Chat-templated prompts carry their special tokens already: pass False for them."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer: give prompts as token ids")
            return self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        return list(prompt)

    def validate(self, token_ids: list[int]) -> None:
        """The one check of a prompt, for the offline LLM and the server alike."""
        if not token_ids:
            raise ValueError("prompt is empty: give at least one token")
        if any((not isinstance(t, int)) or t < 0 or t >= self.vocab_size for t in token_ids):
            raise ValueError(f"prompt contains token ids outside the vocabulary "
                             f"[0, {self.vocab_size})")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(f"This model's maximum context length is {self.max_model_len} "
                             f"tokens, but the prompt has {len(token_ids)} tokens (the prompt "
                             "plus at least one generated token must fit). Shorten the prompt.")

    def make_requests(self, request_id: str, prompt: PreparedPrompt,
                      params: SamplingParams) -> list[Request]:
        token_ids, mm_items, mrope = prompt.token_ids, prompt.mm_items, prompt.mrope
        self.validate(token_ids)
        room = self.max_model_len - len(token_ids)
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        requests = []
        for i in range(params.n):
            seed = None if params.seed is None else params.seed + i
            requests.append(Request(
                request_id=child_id(request_id, i, params.n), prompt_token_ids=list(token_ids),
                sampling_params=params, eos_token_ids=self.eos_token_ids, max_tokens=max_tokens,
                mm_items=list(mm_items),
                mrope_positions=None if mrope is None else mrope[0],
                mrope_delta=0 if mrope is None else mrope[1], seed=seed))
        return requests

