"""Image features into a step's input embeddings: each chunk takes the rows of the images its
placeholders cover, every image encoded once by the vision tower (alone: a step's peak is its
largest image's, which the start-up profile measures) or found in the encoder cache.

A step's images are planned first (``plan_images``: where each image's rows go, which images
are encoded now), so that under tensor parallelism rank 0, which alone holds the encoder cache,
can send the plan to the other ranks with the step's inputs (engine/parallel/).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import nn

from autoglm_serve.engine.core.scheduler import ScheduledRequest
from autoglm_serve.engine.parallel.layout import SINGLE, ParallelLayout
from autoglm_serve.multimodal.encoder_cache import EncoderCache
from autoglm_serve.multimodal.inputs import MultiModalItem


@dataclass
class ImageStep:
    """A step's image rows: (flat token offset, image hash, first image row, rows) per piece,
    the images the vision tower encodes now, and the features rank 0 found in its encoder
    cache (only their hashes travel to the other ranks)."""
    pieces: list[tuple[int, str, int, int]]
    encode: list[MultiModalItem]
    cached: dict[str, torch.Tensor | None] = field(default_factory=dict)

    def for_other_ranks(self) -> ImageStep:
        return replace(self, cached=dict.fromkeys(self.cached))


def plan_images(cache: EncoderCache, batch: list[ScheduledRequest]) -> ImageStep | None:
    """Which image rows this step's chunks cover (None: none). Each chunk takes the slice of
    every image it overlaps; the whole image is encoded once (or found in the encoder cache)
    even when its placeholders span several chunks."""
    pieces, encode, cached = [], {}, {}
    flat = 0
    for s in batch:
        req = s.request
        start, end = req.num_computed_tokens, req.num_computed_tokens + s.num_new_tokens
        for item in req.mm_items:
            lo, hi = max(start, item.offset), min(end, item.offset + item.length)
            if lo < hi:
                pieces.append((flat + lo - start, item.content_hash, lo - item.offset, hi - lo))
                h = item.content_hash
                if h not in cached and h not in encode:
                    emb = cache.get(h)
                    if emb is None:
                        encode[h] = item
                    else:
                        cached[h] = emb
        flat += s.num_new_tokens
    return ImageStep(pieces, list(encode.values()), cached) if pieces else None


def embed_step_images(model: nn.Module, step: ImageStep, ids: torch.Tensor,
                      cache: EncoderCache | None, layout: ParallelLayout = SINGLE
                      ) -> torch.Tensor:
    """Input embeddings with image features in place of placeholders. ``cache``: where the
    newly encoded features go (rank 0's encoder cache; None on the other ranks)."""
    features = _encode(model, step.encode, ids.device, layout)
    if cache is not None:
        for h, emb in features.items():
            cache.put(h, emb)
    embeds = model.get_input_embeddings(ids)
    if step.cached:
        features.update(_cached_rows(step, embeds, layout))
    for (at, h, first, rows) in step.pieces:
        if (h, first) in features:       # rows rank 0 sent from its cache, by piece
            embeds[at:at + rows] = features[h, first]
        else:
            embeds[at:at + rows] = features[h][first:first + rows].to(embeds.dtype)
    return embeds


def _encode(model: nn.Module, items: list[MultiModalItem], device: torch.device,
            layout: ParallelLayout) -> dict[str, torch.Tensor]:
    """Features by content hash. One image at a time: a step's vision-tower peak is then its
    largest image's, which the start-up profile measures, however many images the step
    touches. With the tower data-parallel, image i is encoded by rank i % world and sent to
    the others."""
    found = {}
    for i, item in enumerate(items):
        owner = layout.image_owner(i)
        if owner is None or owner == layout.rank:
            emb = model.embed_images(item.patches(device), [item.grid_thw])
        else:
            emb = model.image_features_like(item.length, device)
        if owner is not None:
            layout.broadcast(emb, owner)
        found[item.content_hash] = emb
    return found


def _cached_rows(step: ImageStep, embeds: torch.Tensor, layout: ParallelLayout
                 ) -> dict[tuple[str, int], torch.Tensor]:
    """The rows of the pieces rank 0 found in its encoder cache, by (hash, first row): read
    there, sent to the other ranks in one broadcast."""
    pieces = [(h, first, rows) for _, h, first, rows in step.pieces if h in step.cached]
    if layout.rank == 0:
        packed = torch.cat([step.cached[h][first:first + rows].to(embeds.dtype)
                            for h, first, rows in pieces])
    else:
        packed = embeds.new_empty(sum(rows for _, _, rows in pieces), embeds.shape[-1])
    if layout.world_size > 1:
        layout.broadcast(packed, 0)
    out, at = {}, 0
    for h, first, rows in pieces:
        out[h, first] = packed[at:at + rows]
        at += rows
    return out


def encoder_cache_bytes(model: nn.Module, cache: EncoderCache | None,
                        device: torch.device) -> int:
    """What the encoder cache holds when full (image embeddings at the LLM's width)."""
    if cache is None:
        return 0
    with torch.inference_mode():
        row = model.get_input_embeddings(torch.zeros(1, dtype=torch.int64, device=device))
    return cache.max_tokens * row.shape[-1] * row.element_size()
