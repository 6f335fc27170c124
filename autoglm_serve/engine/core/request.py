"""A request's state inside the engine: tokens, progress, KV blocks."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from autoglm_serve.multimodal.inputs import MultiModalItem
from autoglm_serve.sampling_params import SamplingParams
from autoglm_serve.structured.matcher import RowMatcher


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"        # the core could not run it (engine/core/fault_isolation.py)

    def __init__(self, value: str):
        # a plain attribute: read for every row of every step, where a property over the enum's
        # members costs ~0.3 us
        self.finished = value in ("stop", "length", "abort", "error")


# eq=False: requests are equal only to themselves. The scheduler's list removals compare them,
# and a generated __eq__ built two tuples of every field per comparison (77 ms to remove 512
# finished requests from a running list of 512).
@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: frozenset[int]
    max_tokens: int                      # resolved against max_model_len
    arrival_time: float = field(default_factory=time.monotonic)
    mm_items: list[MultiModalItem] = field(default_factory=list)
    mrope_positions: torch.Tensor | None = None   # [3, prompt_len] for M-RoPE models
    mrope_delta: int = 0
    seed: int | None = None              # the core makes the generator from it, on its device
    generator: torch.Generator | None = None
    grammar: RowMatcher | None = None    # structured output: made by the core
    # prompt_logprobs: one entry per prompt token from the second on, as chunks compute them
    prompt_logprobs: list | None = None

    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_inflight: int = 0                # sampled on the GPU, not yet known here (0 or 1)
    block_ids: list[int] = field(default_factory=list)
    block_row: int = -1                  # its row of the KV manager's block table (-1: none)
    block_hashes: list[int] = field(default_factory=list)
    num_registered_blocks: int = 0       # leading blocks already offered to the prefix cache
    num_cached_tokens: int = -1          # prefix-cache hit at first scheduling (-1: not yet)
    num_preemptions: int = 0
    first_scheduled_time: float | None = None
    # Derived from the sampling params once, as the engine reads them for every row of every
    # step: the tokens that stop it once it has min_tokens (EOS unless ignore_eos, and the stop
    # token ids); whether it uses penalties (its sampling reads its earlier tokens: a row of
    # engine/core/token_counts.py), the repetition penalty among them; greedy without
    # penalties or logprobs.
    stop_ids: frozenset[int] = field(init=False, repr=False)
    penalized: bool = field(init=False, repr=False)
    repetition_penalized: bool = field(init=False, repr=False)
    argmax_only: bool = field(init=False, repr=False)

    def __post_init__(self):
        self.all_token_ids = list(self.prompt_token_ids)
        p = self.sampling_params
        self.stop_ids = frozenset(p.stop_token_ids).union(
            () if p.ignore_eos else self.eos_token_ids)
        self.repetition_penalized = p.repetition_penalty != 1.0
        self.penalized = (self.repetition_penalized or p.frequency_penalty != 0.0
                          or p.presence_penalty != 0.0)
        # a grammar or a logit bias changes the logits: not a bare argmax
        self.argmax_only = (p.greedy and not self.penalized and p.logprobs is None
                            and p.structured is None and not p.logit_bias)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def land_token(self, token_id: int) -> None:
        """The in-flight token arrived from the device."""
        self.num_inflight -= 1
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def mm_hashes_in(self, start: int, end: int) -> tuple[str, ...]:
        """Hashes of the images whose placeholders overlap tokens [start, end)."""
        return tuple(m.content_hash for m in self.mm_items
                     if m.offset < end and m.offset + m.length > start)
