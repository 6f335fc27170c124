"""Prompt logprobs (echo with logprobs on /v1/completions): for each prompt token from the
second on, its logprob (and rank, and the top-k) under the model at the position before it.

Computed from the prefill's hidden states, chunk by chunk, in the same eager forward that
fills the KV cache; such requests take no prefix-cache hit (a cached prefix has no hidden
states) and never ride a CUDA graph while their prompt runs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from autoglm_serve.engine.core.request import Request
from autoglm_serve.engine.core.sampler import LogprobsTensors, compute_logprobs

_ROWS = 512     # logits rows at once: [512, V] float32 is 310 MB at GLM's 151k vocabulary


@dataclass
class PromptLogprobChunk:
    request: Request
    first: int                  # the prompt position whose next token row 0 scores
    logprobs: LogprobsTensors   # one row per scored prompt token


def prompt_logprob_chunks(model, hidden: torch.Tensor, batch, query_start,
                          wanted: set[str]) -> list[PromptLogprobChunk]:
    """The scored positions of this step's chunks, for the requests in wanted."""
    chunks = []
    for i, s in enumerate(batch):
        req = s.request
        if req.request_id not in wanted:
            continue
        start = req.num_computed_tokens
        last = min(start + s.num_new_tokens, req.num_prompt_tokens - 1)
        done = len(req.prompt_logprobs or ())     # recomputed after a preemption: skip
        lo = max(start, done)
        k = req.sampling_params.prompt_logprobs
        q0 = int(query_start[i])
        for a in range(lo, last, _ROWS):
            b = min(a + _ROWS, last)
            logits = model.compute_logits(hidden[q0 + a - start:q0 + b - start])
            targets = torch.tensor(req.prompt_token_ids[a + 1:b + 1], device=logits.device)
            chunks.append(PromptLogprobChunk(req, a, compute_logprobs(logits, targets, k)))
    return chunks


def land_prompt_logprobs(chunks: list[PromptLogprobChunk], entry) -> None:
    """Appends each chunk's entries (entry(sampled_lp, rank, top) -> one item) to its request,
    in prompt order."""
    for c in chunks:
        req, lp = c.request, c.logprobs
        if req.prompt_logprobs is None:
            req.prompt_logprobs = []
        if len(req.prompt_logprobs) != c.first:
            continue        # already scored (a recompute)
        k = req.sampling_params.prompt_logprobs
        for s, r, ids, vals in zip(lp.sampled_logprobs.tolist(), lp.sampled_ranks.tolist(),
                                   lp.top_token_ids.tolist(), lp.top_logprobs.tolist()):
            req.prompt_logprobs.append(entry(s, r, list(zip(ids[:k], vals[:k]))))
