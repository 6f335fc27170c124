"""Vision-tower outputs by image content hash, so an image seen again skips the ViT.

Agents resend the same screenshot across turns and n > 1 requests share one; keeping the
merged embeddings (3,108 × 4096 bf16 = 25 MB for a phone screenshot) is far cheaper than
recomputing ~12k patches of full attention. Least recently used entries go first once the
budget (in image tokens) is exceeded. An image the engine encoded ahead of its prompt's prefill
(engine/core/image_encoder.py) counts as a miss when that prefill first reads it.
"""
from __future__ import annotations

from collections import OrderedDict

import torch


class EncoderCache:
    def __init__(self, max_tokens: int = 65536):
        self.max_tokens = max_tokens
        self.entries: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.encoded_ahead: set[str] = set()    # put by the encoder, not read since
        self.num_tokens = 0
        self.hits = 0
        self.misses = 0

    def get(self, content_hash: str) -> torch.Tensor | None:
        emb = self.entries.get(content_hash)
        if emb is None:
            self.misses += 1
            return None
        self.entries.move_to_end(content_hash)
        if content_hash in self.encoded_ahead:
            self.encoded_ahead.discard(content_hash)
            self.misses += 1
        else:
            self.hits += 1
        return emb

    def clear(self) -> None:
        """Empty, counters included (after the engine's warm-up)."""
        self.evict_all()
        self.hits = self.misses = 0

    def evict_all(self) -> None:
        """Empty, counters kept (the engine ran out of device memory)."""
        self.entries.clear()
        self.encoded_ahead.clear()
        self.num_tokens = 0

    def put(self, content_hash: str, embeddings: torch.Tensor, encoded_ahead: bool = False
            ) -> None:
        if content_hash in self.entries:
            return
        self.entries[content_hash] = embeddings
        if encoded_ahead:
            self.encoded_ahead.add(content_hash)
        self.num_tokens += embeddings.shape[0]
        while self.num_tokens > self.max_tokens and len(self.entries) > 1:
            old_hash, old = self.entries.popitem(last=False)
            self.encoded_ahead.discard(old_hash)
            self.num_tokens -= old.shape[0]
