"""A scheduled step's flat inputs on the host (HostBatch): decodes first, as the attention
contract (models/layers/attention.py) wants, with the slots, positions and sampling rows the
runner stages on the device."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from autoglm_serve.engine.core.kv_cache import BlockTable
from autoglm_serve.engine.core.request import Request
from autoglm_serve.engine.core.scheduler import ScheduledRequest


@dataclass
class HostBatch:
    batch: list[ScheduledRequest]
    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    query_start: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    num_decodes: int
    max_query_len: int
    sampling: list[Request]      # requests whose chunk ends the known tokens: they sample...
    logits_index: np.ndarray     # ...from the hidden states of these flat token slots
    has_images: bool             # some chunk may cover image placeholders
    feed_at: np.ndarray          # flat token slots whose id is still on the GPU (in flight)...
    feed_from: np.ndarray        # ...and where it sits in the previous step's sampled tokens

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)    # batch is not sent to tensor-parallel workers


def fill_mrope_positions(out: np.ndarray, q0: int, req: Request, start: int,
                          end: int) -> None:
    """out[:, q0:q0 + end - start] = M-RoPE positions [3, ...] of tokens start..end: the
    prompt's precomputed rows (images), then text positions shifted by the request's delta.
    Plain numpy: at hundreds of decode rows a step, per-row torch ops cost milliseconds."""
    p = req.num_prompt_tokens
    mid = min(end, p)
    if start < mid:
        if req.mrope_positions is not None:
            out[:, q0:q0 + mid - start] = np.asarray(req.mrope_positions[:, start:mid])
        else:
            out[:, q0:q0 + mid - start] = np.arange(start, mid)
    lo = max(start, p)
    if end > lo:
        out[:, q0 + lo - start:q0 + end - start] = np.arange(lo, end) + req.mrope_delta


def build_host_batch(scheduled: list[ScheduledRequest], block_table: BlockTable,
                     block_size: int, uses_mrope: bool, prev_rows: dict[str, int]) -> HostBatch:
    """The step's flat inputs on the host, decodes first (the attention contract). Decode
    rows, hundreds a step, are filled by whole-array numpy ops; prefill chunks one by one.
    prev_rows: each request's row in the step still in flight, whose sampled token it feeds."""
    bs = block_size
    n = len(scheduled)
    query_lens = np.fromiter((s.num_new_tokens for s in scheduled), np.int64, n)
    chunk = query_lens != 1
    if (chunk[:-1] > chunk[1:]).any():      # a decode after a chunk: decodes first, stably
        order = np.argsort(chunk, kind="stable")
        scheduled = [scheduled[i] for i in order]
        query_lens, chunk = query_lens[order], chunk[order]
    nd = n - int(chunk.sum())
    reqs = [s.request for s in scheduled]
    starts_list = [r.num_computed_tokens for r in reqs]
    starts = np.array(starts_list, np.int64)
    ends = starts + query_lens
    num_known = np.fromiter((len(r.all_token_ids) for r in reqs), np.int64, n)
    query_start = np.zeros(n + 1, np.int64)
    np.cumsum(query_lens, out=query_start[1:])
    num_tokens = int(query_start[-1])
    tables = block_table.tables(np.fromiter((r.block_row for r in reqs), np.intp, n))
    input_ids = np.zeros(num_tokens, np.int64)
    slots = np.empty(num_tokens, np.int64)
    positions = np.empty((3, num_tokens) if uses_mrope else num_tokens, np.int64)

    # decodes: row i is flat token i
    pos = starts[:nd]
    slots[:nd] = tables[np.arange(nd), pos // bs].astype(np.int64) * bs + pos % bs
    fed = pos >= num_known[:nd]     # sampled by the step still in flight: fed on the GPU
    feed_at = np.flatnonzero(fed)
    feed_from = np.fromiter((prev_rows[reqs[i].request_id] for i in feed_at.tolist()),
                            np.int64, len(feed_at))
    known = np.flatnonzero(~fed).tolist()
    input_ids[known] = [reqs[i].all_token_ids[starts_list[i]] for i in known]
    if uses_mrope:
        # past the prompt, all three M-RoPE positions are the text position plus the delta
        deltas = np.fromiter((r.mrope_delta for r in reqs[:nd]), np.int64, nd)
        positions[:, :nd] = pos + deltas
        in_prompt = pos < np.fromiter((len(r.prompt_token_ids) for r in reqs[:nd]),
                                      np.int64, nd)
        for i in np.flatnonzero(in_prompt).tolist():   # a one-token chunk of a prompt
            fill_mrope_positions(positions, i, reqs[i], starts_list[i],
                                       starts_list[i] + 1)
    else:
        positions[:nd] = pos

    for i in range(nd, n):      # prefill chunks
        req, start, end = reqs[i], starts_list[i], int(ends[i])
        q0, q1 = int(query_start[i]), int(query_start[i + 1])
        input_ids[q0:q1] = req.all_token_ids[start:end]
        chunk_pos = np.arange(start, end)
        slots[q0:q1] = tables[i, chunk_pos // bs].astype(np.int64) * bs + chunk_pos % bs
        if uses_mrope:
            fill_mrope_positions(positions, q0, req, start, end)
        else:
            positions[q0:q1] = chunk_pos

    has_images = any(r.mm_items and start < len(r.prompt_token_ids)
                     for r, start in zip(reqs, starts_list))
    samples = ends == num_known + np.fromiter((r.num_inflight for r in reqs), np.int64, n)
    logits_rows = np.flatnonzero(samples)
    sampling = reqs if len(logits_rows) == n else [reqs[i] for i in logits_rows.tolist()]
    return HostBatch(scheduled, torch.from_numpy(input_ids), torch.from_numpy(positions),
                     torch.from_numpy(slots), torch.from_numpy(query_start.astype(np.int32)),
                     torch.from_numpy(ends.astype(np.int32)), torch.from_numpy(tables), nd,
                     int(query_lens.max()), sampling, query_start[1:][logits_rows] - 1,
                     has_images, feed_at, feed_from)
