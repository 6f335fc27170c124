"""The vision tower run ahead of the prefill that needs it, a step's budget of blocks at a time.

A phone screenshot is ~12k patches of full attention through 24 blocks: ~72 ms on an H200,
during which every running decode would wait if the tower ran whole inside one step (the
phone-agent workload's steps of 100-120 ms). The core gives the encoder what is left of a
step's token budget after the running requests (decodes, and prefills up to their next
image: engine_core.py), priced in the language model's token-equivalents of compute, and the
encoder runs that many blocks of the image that the first held prompt needs, keeping the
hidden states between steps. The scheduler does
not let a prompt's chunk reach an image before it is encoded (scheduler.py). With nothing
decoding, the budget is the whole step's: one agent's screenshot goes through in one or two
steps, as fast as whole.

Blocks are priced by FLOPs. Least-squares fits of served 16-agent step traces on an H100 put a
vision token-equivalent at 1.0-1.13x a prompt token's time in bf16 and ~1.2x with FP8 linears
(BENCHMARKS.md, thirty-ninth session). Correcting that by timing an eager prompt forward at
start-up was tried and dropped: where that forward is host-bound it reads the host's time
(0.76x and 0.57x where the traces said 1.0x and 1.2x).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from autoglm_serve.multimodal.encoder_cache import EncoderCache
from autoglm_serve.multimodal.inputs import MultiModalItem


class _InProgress(NamedTuple):
    content_hash: str
    encoding: object            # the tower's VisionEncoding
    block_cost: float           # a block's price in token-equivalents
    merger_cost: float          # ...and the downsample and merger's, run with the last block


def blocks_to_run(blocks_left: int, budget_tokens: float, block_cost: float,
                  merger_cost: float) -> int:
    """How many of an image's remaining blocks a step's budget pays for: at least one, and
    the last only with the merger that runs after it."""
    n = max(1, min(blocks_left, int(budget_tokens // block_cost)))
    if n == blocks_left and n > 1 and n * block_cost + merger_cost > budget_tokens:
        n -= 1      # the merger does not fit beside them: the last block waits for it
    return n


class ImageEncoder:
    def __init__(self, model: nn.Module, cache: EncoderCache, device: torch.device):
        self.model = model
        self.cache = cache
        self.device = device
        self.token_flops = model.flops_per_text_token()
        self._current: _InProgress | None = None
        self.blocks_run = 0

    def ready(self, item: MultiModalItem) -> bool:
        return item.content_hash in self.cache.entries

    @property
    def in_progress(self) -> str | None:
        """The content hash of the image whose blocks are part run, if any."""
        return self._current.content_hash if self._current is not None else None

    def reset(self) -> None:
        """Drops the encoding in progress (after running out of memory: its states go)."""
        self._current = None

    @torch.inference_mode()
    def encode(self, item: MultiModalItem, budget_tokens: int) -> int:
        """Runs as many of this image's remaining blocks as the budget pays for (at least
        one), begun now if it is not the one in progress; the last block brings the merger
        with it, and the embeddings go to the encoder cache. Returns the budget used, in
        token-equivalents."""
        if self.in_progress != item.content_hash:
            encoding = self.model.begin_images(item.patches(self.device), [item.grid_thw])
            tower = self.model.visual
            self._current = _InProgress(
                item.content_hash, encoding,
                tower.block_flops(encoding.frame_lens) / self.token_flops,
                tower.finish_flops(sum(encoding.frame_lens)) / self.token_flops)
        content_hash, encoding, cost, finish = self._current
        n = blocks_to_run(encoding.blocks_left, budget_tokens, cost, finish)
        encoding.advance(n)
        self.blocks_run += n
        used = n * cost
        if not encoding.blocks_left:
            self.cache.put(content_hash, encoding.result(), encoded_ahead=True)
            self._current = None
            used += finish
        return math.ceil(used)

    def state_bytes(self, item: MultiModalItem) -> int:
        """What an encoding in progress holds between steps for this image: hidden states and
        residual (the tower's dtype), and the rotary tables (float32)."""
        tower = self.model.visual
        patches = item.grid_thw[0] * item.grid_thw[1] * item.grid_thw[2]
        width = next(tower.parameters()).element_size()
        head_half = tower.hidden // tower.num_heads // 2
        return patches * (2 * tower.hidden * width + 2 * head_half * 4)
