"""Turns a scheduled batch into flat device tensors, runs the model, samples.

The batch layout is the attention contract (models/layers/attention.py): single-token queries
(decodes) first, then prefill chunks. Inputs are staged in persistent device buffers so that a
pure-decode step can replay a captured CUDA graph over the same memory.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from autoglm_serve.engine.request import Request
from autoglm_serve.engine.sampler import Sampler, SamplerOutput, SamplingBatch, SamplingRow
from autoglm_serve.engine.scheduler import ScheduledRequest
from autoglm_serve.models.layers.attention import Attention, AttentionBackend, AttentionMetadata
from autoglm_serve.multimodal.encoder_cache import EncoderCache


@dataclass
class StepResult:
    requests: list[Request]          # those that sampled a token this step, in row order
    sampled: list[int]
    sampler_output: SamplerOutput


class ModelRunner:
    def __init__(self, model: nn.Module, backend: AttentionBackend, device: torch.device,
                 dtype: torch.dtype, block_size: int, max_model_len: int, max_num_seqs: int,
                 max_num_batched_tokens: int, vocab_size: int):
        self.model = model
        self.backend = backend
        self.device = device
        self.dtype = dtype
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.max_num_tokens = max_num_batched_tokens
        self.vocab_size = vocab_size
        self.max_blocks_per_seq = (max_model_len + block_size - 1) // block_size
        self.uses_mrope = bool(getattr(model, "uses_mrope", False))
        self.sampler = Sampler()
        self.kv_caches: list[torch.Tensor] = []
        self.attention_layers = [m for m in model.modules() if isinstance(m, Attention)]
        for layer in self.attention_layers:
            layer.backend = backend
        # Observer of every step's logits (tests compare them with transformers).
        self.logits_hook: Callable[[list[Request], torch.Tensor], None] | None = None
        self.encoder_cache = EncoderCache() if hasattr(model, "embed_images") else None
        self.pin = device.type == "cuda"

    # ---- KV cache -------------------------------------------------------------------------
    def kv_bytes_per_block(self) -> int:
        per_layer = 0
        for layer in self.attention_layers:
            per_layer += 2 * layer.num_kv_heads * self.block_size * layer.head_dim
        return per_layer * torch.tensor([], dtype=self.dtype).element_size()

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.kv_caches = []
        for layer in self.attention_layers:
            cache = torch.zeros(2, num_blocks, layer.num_kv_heads, self.block_size, layer.head_dim,
                                dtype=self.dtype, device=self.device)
            layer.kv_cache = cache
            self.kv_caches.append(cache)

    # ---- inputs ---------------------------------------------------------------------------
    def _positions(self, req: Request, start: int, end: int) -> torch.Tensor | range:
        if not self.uses_mrope:
            return range(start, end)
        p = req.num_prompt_tokens
        parts = []
        if start < p and req.mrope_positions is not None:
            parts.append(req.mrope_positions[:, start:min(end, p)])
        elif start < p:
            parts.append(torch.arange(start, min(end, p)).expand(3, -1))
        if end > p:
            tail = torch.arange(max(start, p), end) + req.mrope_delta
            parts.append(tail.expand(3, -1))
        return torch.cat(parts, dim=1)

    def _to_device(self, data, dtype) -> torch.Tensor:
        t = torch.as_tensor(data, dtype=dtype)
        if self.pin:
            return t.pin_memory().to(self.device, non_blocking=True)
        return t.to(self.device)

    def prepare(self, scheduled: list[ScheduledRequest]):
        # decodes first: the attention contract
        batch = sorted(scheduled, key=lambda s: s.num_new_tokens != 1)
        input_ids: list[int] = []
        positions: list = []
        slots: list[int] = []
        query_start = [0]
        seq_lens: list[int] = []
        tables = torch.zeros(len(batch), self.max_blocks_per_seq, dtype=torch.int32)
        logits_rows: list[int] = []
        bs = self.block_size
        for i, s in enumerate(batch):
            req, n = s.request, s.num_new_tokens
            start, end = req.num_computed_tokens, req.num_computed_tokens + n
            input_ids.extend(req.all_token_ids[start:end])
            positions.append(self._positions(req, start, end))
            blocks = req.block_ids
            slots.extend(blocks[p // bs] * bs + p % bs for p in range(start, end))
            query_start.append(query_start[-1] + n)
            seq_lens.append(end)
            tables[i, :len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
            if s.samples:
                logits_rows.append(i)
        num_decodes = sum(1 for s in batch if s.num_new_tokens == 1)
        if self.uses_mrope:
            pos = torch.cat(positions, dim=1)
        else:
            pos = [p for r in positions for p in r]
        qsl_cpu = torch.tensor(query_start, dtype=torch.int32)
        seq_lens_cpu = torch.tensor(seq_lens, dtype=torch.int32)
        meta = AttentionMetadata(
            num_seqs=len(batch), num_decodes=num_decodes, num_tokens=len(input_ids),
            max_query_len=max(s.num_new_tokens for s in batch), max_seq_len=max(seq_lens),
            query_start_loc=self._to_device(qsl_cpu, torch.int32),
            seq_lens=self._to_device(seq_lens_cpu, torch.int32),
            block_tables=self._to_device(tables, torch.int32),
            slot_mapping=self._to_device(slots, torch.int64),
            query_start_loc_cpu=qsl_cpu, seq_lens_cpu=seq_lens_cpu)
        ids = self._to_device(input_ids, torch.int64)
        pos = self._to_device(pos, torch.int64)
        logits_index = self._to_device([query_start[i + 1] - 1 for i in logits_rows], torch.int64)
        return batch, ids, pos, meta, logits_rows, logits_index

    # ---- step -----------------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, scheduled: list[ScheduledRequest]) -> StepResult:
        batch, ids, pos, meta, logits_rows, logits_index = self.prepare(scheduled)
        inputs_embeds = self.multimodal_embeddings(batch, ids)
        hidden = self.model(ids, pos, meta, inputs_embeds=inputs_embeds)
        sampling = [batch[i].request for i in logits_rows]
        if not sampling:
            return StepResult([], [], None)
        logits = self.model.compute_logits(hidden[logits_index])
        if self.logits_hook is not None:
            self.logits_hook(sampling, logits)
        rows = [SamplingRow(r.sampling_params, r.prompt_token_ids, r.output_token_ids,
                            r.generator, r.eos_token_ids) for r in sampling]
        out = self.sampler(logits, SamplingBatch.build(rows, logits.shape[-1], logits.device))
        return StepResult(sampling, out.sampled_token_ids.tolist(), out)

    def multimodal_embeddings(self, batch: list[ScheduledRequest],
                              ids: torch.Tensor) -> torch.Tensor | None:
        """Input embeddings with image features in place of placeholders (None: text only).

        Each chunk takes the slice of every image it overlaps; the whole image is encoded once
        (or found in the encoder cache) even when its placeholders span several chunks."""
        if self.encoder_cache is None:
            return None
        pieces = []   # (flat token offset in this step, image item, first image row, rows)
        flat = 0
        for s in batch:
            req = s.request
            start, end = req.num_computed_tokens, req.num_computed_tokens + s.num_new_tokens
            for item in req.mm_items:
                lo, hi = max(start, item.offset), min(end, item.offset + item.length)
                if lo < hi:
                    pieces.append((flat + lo - start, item, lo - item.offset, hi - lo))
            flat += s.num_new_tokens
        if not pieces:
            return None
        features = self._encode([item for _, item, _, _ in pieces])
        embeds = self.model.get_input_embeddings(ids)
        for (at, item, first, rows) in pieces:
            embeds[at:at + rows] = features[item.content_hash][first:first + rows].to(embeds.dtype)
        return embeds

    def _encode(self, items) -> dict[str, torch.Tensor]:
        """Image features by content hash: cached ones looked up, the rest encoded together."""
        found, todo = {}, {}
        for item in items:
            if item.content_hash in found or item.content_hash in todo:
                continue
            emb = self.encoder_cache.get(item.content_hash)
            if emb is None:
                todo[item.content_hash] = item
            else:
                found[item.content_hash] = emb
        if todo:
            pixels = torch.cat([i.pixel_values for i in todo.values()]).to(self.device)
            out = self.model.embed_images(pixels, [i.grid_thw for i in todo.values()])
            offset = 0
            for h, item in todo.items():
                emb = out[offset:offset + item.length]
                offset += item.length
                self.encoder_cache.put(h, emb)
                found[h] = emb
        return found

    @torch.inference_mode()
    def profile_run(self) -> None:
        """One forward over max_num_batched_tokens tokens, so the caller can measure peak
        activation memory before sizing the KV cache."""
        n = self.max_num_tokens
        meta_seq = min(n, self.max_model_len)
        num_seqs = (n + meta_seq - 1) // meta_seq
        lens = [meta_seq] * (num_seqs - 1) + [n - meta_seq * (num_seqs - 1)]
        qsl = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32)
        seq_lens = torch.tensor(lens, dtype=torch.int32)
        meta = AttentionMetadata(
            num_seqs=num_seqs, num_decodes=0, num_tokens=n, max_query_len=max(lens),
            max_seq_len=max(lens), query_start_loc=qsl.to(self.device),
            seq_lens=seq_lens.to(self.device),
            block_tables=torch.zeros(num_seqs, self.max_blocks_per_seq, dtype=torch.int32,
                                     device=self.device),
            slot_mapping=torch.full((n,), -1, dtype=torch.int64, device=self.device),
            query_start_loc_cpu=qsl, seq_lens_cpu=seq_lens)
        ids = torch.zeros(n, dtype=torch.int64, device=self.device)
        pos = torch.arange(n, device=self.device) % self.max_model_len
        if self.uses_mrope:
            pos = pos.expand(3, -1)
        hidden = self.model(ids, pos, meta)
        self.model.compute_logits(hidden[:min(n, self.max_num_seqs)])
