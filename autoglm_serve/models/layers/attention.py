"""Paged attention: the metadata contract between the runner and attention backends.

One engine step runs a flat, varlen batch: the tokens of every scheduled sequence are
concatenated, sequences whose query is a single token (decodes) first, then prefill chunks.
Each sequence attends to its whole context (cached tokens, read through its block table,
plus the tokens of this step, causally).

KV cache layout, one tensor per layer: ``[2, num_blocks, num_kv_heads, block_size, head_dim]``
(index 0 = K, 1 = V). One (block, kv head) tile is contiguous, so a kernel loads it once for all
the query heads that share it (GQA). On a CPU the same shape is a view of memory laid out heads
first (``new_kv_cache``), so that a run of consecutive blocks is one strided tensor per head.

Padding rows (CUDA-graph batches padded to a captured size) have ``slot_mapping == -1``
(nothing written) and ``seq_lens == 0`` (output ignored).

The rotary embedding of q and k is part of the op: a backend may fuse it into its KV write
(``fuses_rotary``); otherwise ``Attention`` rotates them before calling it.
"""
from __future__ import annotations

import math
import mmap
from dataclasses import dataclass

import torch
from torch import nn

from autoglm_serve.models.layers.rotary import RotaryEmbedding


@dataclass
class Rope:
    """This step's rotary embedding, for a backend that applies it itself: the first
    2 * cos.shape[-1] features of every q and k head are rotated by cos/sin ([T, rotary_dim // 2]
    float32), pairs interleaved (GLM) or half-split (Llama), as RotaryEmbedding does."""
    cos: torch.Tensor
    sin: torch.Tensor
    interleaved: bool


@dataclass
class AttentionMetadata:
    num_seqs: int
    num_decodes: int            # the first num_decodes sequences have exactly one query token
    num_tokens: int             # sum of query lengths (== leading dim of q)
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor   # int32 [num_seqs + 1], on device
    seq_lens: torch.Tensor          # int32 [num_seqs]: context + this step's tokens, on device
    block_tables: torch.Tensor      # int32 [num_seqs, max_blocks], on device
    slot_mapping: torch.Tensor      # int64 [num_tokens]: block_id * block_size + offset, or -1
    query_start_loc_cpu: torch.Tensor  # the same two on the host, for loops without syncs
    seq_lens_cpu: torch.Tensor


def new_kv_cache(num_blocks: int, num_kv_heads: int, block_size: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One layer's zeroed cache. On a CPU, memory runs [2, Hkv, NB, BS, D], permuted to the
    common shape: a decode at long context then reads each run of blocks as one view that SDPA
    takes in place (at 4,000 tokens, bf16, one thread: 0.26 ms a layer with the cache hot, as
    fast as SDPA over a contiguous copy; 0.73-0.81 ms cold, against 0.89-0.99 for the per-block
    GEMMs of the contiguous layout); a GPU kernel reads tiles and keeps them contiguous."""
    if device.type == "cpu":
        return _zero_pages((2, num_kv_heads, num_blocks, block_size, head_dim),
                           dtype).permute(0, 2, 1, 3, 4)
    return torch.zeros(2, num_blocks, num_kv_heads, block_size, head_dim, dtype=dtype,
                       device=device)


def _zero_pages(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Zeros in an anonymous mapping, whose pages the kernel hands out zeroed as they are first
    written: a CPU cache takes memory as it fills (torch.zeros writes every page at once, the
    embedded default's 2 GiB at each start, and each engine of a test run)."""
    count = math.prod(shape)
    if count == 0:
        return torch.zeros(shape, dtype=dtype)
    pages = mmap.mmap(-1, count * dtype.itemsize)
    return torch.frombuffer(pages, dtype=dtype, count=count).view(shape)


class AttentionBackend:
    """Writes this step's K/V into the paged cache, then attends through the block tables."""

    name = "base"

    def fuses_rotary(self) -> bool:
        """Whether forward takes un-rotated q/k plus a ``rope=Rope(...)`` and rotates them itself
        (fused into its KV write); otherwise the caller rotates them first."""
        return False

    def self_check(self, device: torch.device, dtype: torch.dtype, num_heads: int,
                   num_kv_heads: int, head_dim: int) -> bool:
        """Whether the backend's kernels agree with the PyTorch reference at these shapes (run
        once at start-up; an engine falls back to the reference when not)."""
        return True

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """q: [T, H, D]; k, v: [T, Hkv, D]; kv_cache: [2, NB, Hkv, BS, D]. Returns [T, H, D]."""
        raise NotImplementedError


class Attention(nn.Module):
    """The attention op of one decoder layer, rotary included; its KV cache is bound by the
    runner."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 rotary: RotaryEmbedding):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.rotary = rotary
        self.kv_cache: torch.Tensor | None = None
        self.backend: AttentionBackend | None = None
        # set while prompt steps' CUDA graphs are captured (engine/core/prompt_graphs.py):
        # ends the graph at this attention's inputs and returns the buffer its output goes to
        self.graph_break = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata,
                rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """q [T, H*D], k and v [T, Hkv*D], q and k not yet rotated; rope: this step's
        ``rotary.cos_sin(positions)``."""
        if self.graph_break is not None:
            return self.graph_break(self, q, k, v, rope)
        return self.attend(q, k, v, meta, rope)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata,
               rope: tuple[torch.Tensor, torch.Tensor],
               out: torch.Tensor | None = None) -> torch.Tensor:
        """forward's attention; ``out`` [T, H*D]: where the backend writes it (a backend that
        owns no output buffer writes a new one, copied there)."""
        t = q.shape[0]
        fused = self.backend.fuses_rotary()
        if not fused:
            q, k = self.rotary.apply(q, k, *rope)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        heads_out = None if out is None else out.view(t, self.num_heads, self.head_dim)
        if fused:
            result = self.backend.forward(q, k, v, self.kv_cache, meta, self.scale,
                                          out=heads_out, rope=Rope(*rope, self.rotary.interleaved))
        else:
            result = self.backend.forward(q, k, v, self.kv_cache, meta, self.scale)
            if heads_out is not None:
                heads_out.copy_(result)
                result = heads_out
        return result.reshape(t, self.num_heads * self.head_dim)
