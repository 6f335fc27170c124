"""Image features into a step's input embeddings: each chunk takes the rows of the images its
placeholders cover, every image encoded once by the vision tower (alone: a step's peak is its
largest image's, which the start-up profile measures) or found in the encoder cache."""
from __future__ import annotations

import torch
from torch import nn

from autoglm_serve.engine.core.scheduler import ScheduledRequest
from autoglm_serve.multimodal.encoder_cache import EncoderCache


def embed_images(model: nn.Module, cache: EncoderCache, batch: list[ScheduledRequest],
                 ids: torch.Tensor) -> torch.Tensor | None:
    """Input embeddings with image features in place of placeholders (None: text only).

    Each chunk takes the slice of every image it overlaps; the whole image is encoded once
    (or found in the encoder cache) even when its placeholders span several chunks."""
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
    features = _encode(model, cache, ids.device, [item for _, item, _, _ in pieces])
    embeds = model.get_input_embeddings(ids)
    for (at, item, first, rows) in pieces:
        embeds[at:at + rows] = features[item.content_hash][first:first + rows].to(embeds.dtype)
    return embeds


def _encode(model: nn.Module, cache: EncoderCache, device: torch.device, items
            ) -> dict[str, torch.Tensor]:
    """Image features by content hash: cached ones looked up, the others encoded."""
    found, todo = {}, {}
    for item in items:
        if item.content_hash in found or item.content_hash in todo:
            continue
        emb = cache.get(item.content_hash)
        if emb is None:
            todo[item.content_hash] = item
        else:
            found[item.content_hash] = emb
    for h, item in todo.items():
        # one image at a time: a step's vision-tower peak is then its largest image's,
        # which the start-up profile measures, however many images the step touches
        emb = model.embed_images(item.patches(device), [item.grid_thw])
        cache.put(h, emb)
        found[h] = emb
    return found


def encoder_cache_bytes(model: nn.Module, cache: EncoderCache | None,
                        device: torch.device) -> int:
    """What the encoder cache holds when full (image embeddings at the LLM's width)."""
    if cache is None:
        return 0
    with torch.inference_mode():
        row = model.get_input_embeddings(torch.zeros(1, dtype=torch.int64, device=device))
    return cache.max_tokens * row.shape[-1] * row.element_size()
