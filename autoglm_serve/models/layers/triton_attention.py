"""The Triton attention backend: the GPU fast path over the paged KV cache.

One forward = three launches at most: KV write (with the rotary of q and k fused in), decode
attention (its split-K merge included) over the first ``num_decodes`` sequences, prefill
attention over the rest. Nothing reads a device tensor on the host, and the decode launches
depend only on the batch shape (never on context lengths, the split-K grid included), so
pure-decode steps can be captured once and replayed.
"""
from __future__ import annotations

import torch

from autoglm_serve.kernels import fused_ops_enabled
from autoglm_serve.kernels.kv_write import rotate_and_write_kv_cache, write_kv_cache
from autoglm_serve.kernels.paged_attention import (DecodeSplit, decode_attention, decode_split,
                                                   prefill_attention)
from autoglm_serve.models.layers.attention import AttentionBackend, AttentionMetadata, Rope


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the Triton interpreter on CPU: keep the split-K grid small but above one


class TritonAttentionBackend(AttentionBackend):
    name = "triton"

    def __init__(self, max_decode_partitions: int = 64):
        # Upper bound of the split-K grid (a power of two; see decode_split).
        assert max_decode_partitions & (max_decode_partitions - 1) == 0
        self.max_decode_partitions = max_decode_partitions
        self._num_sms: dict[torch.device, int] = {}
        self._merge_counters: dict[torch.device, torch.Tensor] = {}
        # Outgrown counter buffers: CUDA graphs captured with them still use them.
        self._outgrown: list[torch.Tensor] = []

    def decode_split(self, num_decodes: int, num_kv_heads: int,
                     device: torch.device) -> DecodeSplit:
        if device not in self._num_sms:
            self._num_sms[device] = _num_sms(device)
        return decode_split(num_decodes, num_kv_heads, self._num_sms[device],
                            self.max_decode_partitions)

    def merge_counters(self, num: int, device: torch.device) -> torch.Tensor:
        """The decode kernel's split-K counters: persistent, zero between launches (each launch
        resets those it used), so one buffer serves every layer, step and graph replay."""
        counters = self._merge_counters.get(device)
        if counters is None or counters.numel() < num:
            if counters is not None:
                self._outgrown.append(counters)
            counters = torch.zeros(max(num, 4096), dtype=torch.int32, device=device)
            self._merge_counters[device] = counters
        return counters

    def fuses_rotary(self) -> bool:
        # off with the other fused kernels when the start-up self-check failed
        return fused_ops_enabled()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float, out: torch.Tensor | None = None,
                rope: Rope | None = None) -> torch.Tensor:
        """As AttentionBackend.forward; ``out`` ([T, H, D]) lets a caller (a CUDA graph, a test
        that poisons it) own the output buffer. With ``rope``, q and k come un-rotated: q is
        rotated in place and k on its way into the cache."""
        if rope is None:
            write_kv_cache(k, v, kv_cache, meta.slot_mapping)
        else:
            rotate_and_write_kv_cache(q, k, v, kv_cache, meta.slot_mapping, rope.cos, rope.sin,
                                      rope.interleaved)
        if out is None:
            out = torch.empty_like(q)
        nd = meta.num_decodes
        if nd > 0:
            num_kv_heads = kv_cache.shape[2]
            decode_attention(out[:nd], q[:nd], kv_cache, meta.block_tables[:nd],
                             meta.seq_lens[:nd], scale,
                             self.decode_split(nd, num_kv_heads, q.device),
                             self.merge_counters(nd * num_kv_heads, q.device))
        if meta.num_seqs > nd:
            prefill_attention(out, q, kv_cache, meta.block_tables, meta.seq_lens,
                              meta.query_start_loc, scale, seq_offset=nd,
                              num_seqs=meta.num_seqs - nd, max_query_len=meta.max_query_len)
        return out
