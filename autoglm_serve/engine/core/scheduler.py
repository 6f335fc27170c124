"""Continuous batching with chunked prefill, prefix caching and preemption by recompute.

Every step, each request is owed ``num_tokens - num_computed_tokens`` tokens (its prompt at
first, one token per step once decoding; after a preemption, everything again). The scheduler
hands out the step's token budget: running decodes first, then running prefills (chunked), then
waiting requests in arrival order. When the KV cache is full, the most recently arrived running
request is preempted: its blocks are freed and it goes back to the front of the queue to be
recomputed later (the prefix cache usually makes that cheap).

Images: a chunk never reaches an image placeholder whose embeddings are not ready yet
(``image_ready``); the core encodes ahead the one ``image_to_encode`` names
(engine/core/image_encoder.py), for the held prompts in arrival order. A waiting prompt held by
its image lets the ones behind it go.
A chunk that such an image would cut to fewer than ``MIN_CHUNK_BEFORE_IMAGE`` tokens waits for
the image instead, and joins the chunk that reads it.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from autoglm_serve.engine.core.kv_cache import KVCacheManager
from autoglm_serve.engine.core.request import Request, RequestStatus
from autoglm_serve.multimodal.inputs import MultiModalItem


# A phone agent's new turn puts ~20 tokens of text before its screenshot. Run alone while the
# screenshot encodes, they cost a whole forward: its GEMMs read every weight whatever the rows
# (AutoGLM-Phone-9B: ~16 GB, ~4 ms on an H200, the compute of ~200 tokens) and its attention
# scans the whole context for a few queries. Joined to the image's chunk they cost their FLOPs.
MIN_CHUNK_BEFORE_IMAGE = 256


@dataclass(slots=True)
class ScheduledRequest:
    request: Request
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """True when this step computes the request's last known token, so it yields logits."""
        r = self.request
        return r.num_computed_tokens + self.num_new_tokens == len(r.all_token_ids) + r.num_inflight


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    num_batched_tokens: int = 0
    preempted: list[Request] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int,
                 enable_chunked_prefill: bool = True, max_model_len: int = 1 << 30,
                 image_ready: Callable[[MultiModalItem], bool] | None = None,
                 decode_step_tokens: int | None = None):
        self.kv = kv
        self.image_ready = image_ready
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.decode_step_tokens = decode_step_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    # ---- queue ----------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, request: Request, status: RequestStatus) -> None:
        """Ends a request wherever it is and frees its blocks (also used for aborts)."""
        if request.status.finished:
            return
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            try:
                self.waiting.remove(request)
            except ValueError:
                pass
        request.status = status
        self.kv.free(request)

    # ---- scheduling -----------------------------------------------------------------------
    def schedule(self, budget: int | None = None) -> SchedulerOutput:
        """budget: the step's tokens (default max_num_batched_tokens; less what the vision
        tower took this step); running decodes get theirs whatever is left."""
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens if budget is None else max(budget, 0)
        start_budget = budget
        chosen: set[str] = set()

        # Running requests: decodes (one token owed) before prefill chunks. What each owes (an
        # in-flight token counts: its id will be fed from the GPU) is read once (a preemption in
        # this loop changes only its victim, skipped after).
        running = self.running
        owed = [len(r.all_token_ids) + r.num_inflight - r.num_computed_tokens for r in running]
        order = zip(running, owed)
        if max(owed, default=0) > 1:
            order = sorted(order, key=lambda pair: pair[1] > 1)
        running_status = RequestStatus.RUNNING     # an Enum member's lookup costs ~70 ns
        for req, n in order:
            if budget == 0:
                break
            if req.status is not running_status:
                continue        # preempted by a request before it in this loop
            if req.num_inflight and self._ends_with_inflight(req):
                continue        # its in-flight token is its last: nothing more to compute
            if n > budget:
                n = budget
            if n > 1 and self.image_ready is not None and req.mm_items:
                n = self._up_to_unready_image(req, req.num_computed_tokens, n)
                if n == 0:
                    continue
            while not self.kv.allocate(req, n):
                victim = self._pick_victim(chosen)
                self._preempt(victim, out)
                if victim is req:
                    break
            else:
                chosen.add(req.request_id)
                out.scheduled.append(ScheduledRequest(req, n))
                budget -= n

        # Waiting requests, in order, while there is room (none after a preemption: the cache
        # is already short); one whose next chunk starts at an image not encoded yet is passed.
        held = 0
        while len(self.waiting) > held and not out.preempted and budget > 0 \
                and len(self.running) < self.max_num_seqs:
            req = self.waiting[held]
            if req.num_inflight:
                break           # preempted while a token was in flight: wait for it to land
            # prompt logprobs need every prompt position computed: no prefix-cache hit
            cached = self.kv.find_cached_prefix(req) if req.num_computed_tokens == 0 \
                and req.sampling_params.prompt_logprobs is None else []
            computed = req.num_computed_tokens + len(cached) * self.kv.block_size
            n = req.num_tokens - computed
            if n > budget:
                if not self.enable_chunked_prefill:
                    break
                n = budget
            if self.image_ready is not None and req.mm_items:
                n = self._up_to_unready_image(req, computed, n)
                if n == 0:
                    held += 1
                    continue
            if not self.kv.allocate(req, n, cached):
                break
            del self.waiting[held]
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = computed
                self.kv.record_prefix_lookup(req.num_tokens, computed)
            if req.first_scheduled_time is None:
                req.first_scheduled_time = time.monotonic()
            req.num_computed_tokens = computed
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            chosen.add(req.request_id)
            out.scheduled.append(ScheduledRequest(req, n))
            budget -= n

        out.num_batched_tokens = start_budget - budget
        return out

    # ---- images ---------------------------------------------------------------------------
    def _up_to_unready_image(self, req: Request, start: int, n: int) -> int:
        """n, or fewer: the chunk from token ``start`` stops before the first image it would
        reach whose embeddings are not ready (0: it starts inside or at one, or what is left
        before it is under ``MIN_CHUNK_BEFORE_IMAGE``: it waits for the image)."""
        item = self._next_unready_image(req, start)
        if item is None or item.offset >= start + n:
            return n
        before = item.offset - start
        return before if before >= MIN_CHUNK_BEFORE_IMAGE else 0

    def image_to_encode(self, in_progress: str | None = None
                        ) -> tuple[Request, MultiModalItem] | None:
        """The image the earliest-arrived prompt held by one needs: among running prefills
        and the first waiting prompt with images (past its prefix-cached tokens), so the
        encoder serves prompts in arrival order. Running prefills first would let every later
        turn with a long enough text before its image (admitted up to it) jump a turn held
        whole, and drop its half-encoded image: 64 phone agents' first turns waited up to
        34-53 s so (scripts/phone_agent_schedule_sim.py). The image ``in_progress`` (its
        content hash) is kept while anyone still needs it: switching drops the blocks run."""
        if self.image_ready is None:
            return None
        candidates = []
        for req in self.running:
            if req.mm_items and req.num_computed_tokens < req.num_prompt_tokens:
                item = self._next_unready_image(req, req.num_computed_tokens)
                if item is not None:
                    candidates.append((req, item))
        for req in self.waiting:
            if req.mm_items and not req.status.finished:
                start = req.num_computed_tokens
                if start == 0:
                    start = len(self.kv.find_cached_prefix(req)) * self.kv.block_size
                item = self._next_unready_image(req, start)
                # the first waiting prompt with images only: until it is admitted, another
                # waiting prompt's image encoded now could push its own out of the encoder cache
                if item is not None:
                    candidates.append((req, item))
                break
        for pair in candidates:
            if pair[1].content_hash == in_progress:
                return pair
        return min(candidates, key=lambda pair: pair[0].arrival_time, default=None)

    def _next_unready_image(self, req: Request, start: int) -> MultiModalItem | None:
        """The first image (in prompt order) not ready that ends after token ``start``."""
        for item in req.mm_items:
            if item.offset + item.length > start and not self.image_ready(item):
                return item
        return None

    def step_budget(self) -> int:
        """The step's tokens: max_num_batched_tokens, or decode_step_tokens while a request
        decodes, so that prompt chunks and vision blocks stretch each of its tokens by at most
        that much work."""
        limit = self.decode_step_tokens
        if limit is None or limit >= self.max_num_batched_tokens or not self.has_decodes():
            return self.max_num_batched_tokens
        return limit

    def has_decodes(self) -> bool:
        """Whether a running request is past its prompt (its next token is a decode)."""
        return any(r.num_computed_tokens >= r.num_prompt_tokens for r in self.running)

    def tokens_owed_by_running(self) -> int:
        """What running requests can compute this step: a token per decode, and each prefill's
        rest of its prompt up to an image not encoded yet. The encoder gets what the budget
        leaves after them, so a prompt under way is never held for the next one's image."""
        owed = 0
        for r in self.running:
            n = len(r.all_token_ids) + r.num_inflight - r.num_computed_tokens
            if n > 1 and self.image_ready is not None and r.mm_items:
                n = self._up_to_unready_image(r, r.num_computed_tokens, n)
            owed += n
        return owed

    def schedule_alone(self, req: Request, budget: int) -> SchedulerOutput:
        """A step of this running request alone, at most ``budget`` tokens of it (fault
        isolation runs a suspect so); empty when it owes nothing or its blocks do not fit."""
        out = SchedulerOutput()
        n = min(len(req.all_token_ids) + req.num_inflight - req.num_computed_tokens, budget)
        if req.status is RequestStatus.RUNNING and n > 0 and self.kv.allocate(req, n):
            out.scheduled.append(ScheduledRequest(req, n))
            out.num_batched_tokens = n
        return out

    def _ends_with_inflight(self, req: Request) -> bool:
        """Whether the length limits end the request once its in-flight token lands."""
        return (len(req.output_token_ids) + req.num_inflight >= req.max_tokens
                or len(req.all_token_ids) + req.num_inflight >= self.max_model_len)

    def _pick_victim(self, chosen: set[str]) -> Request:
        """The latest-arrived running request not yet given tokens this step (or the last one)."""
        for req in reversed(self.running):
            if req.request_id not in chosen:
                return req
        return self.running[-1]

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        self.running.remove(req)
        self.kv.free(req)
        req.status = RequestStatus.WAITING
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted.append(req)
        self.waiting.appendleft(req)

    def update_after_launch(self, scheduled: list[ScheduledRequest]) -> None:
        """Records the tokens just sent to the GPU (their KV is written by the time any later
        step runs), the token each sampling request will get, and offers full blocks to the
        prefix cache."""
        for s in scheduled:
            req = s.request
            if s.samples:
                req.num_inflight += 1
            req.num_computed_tokens += s.num_new_tokens
            self.kv.cache_computed_blocks(req)
