"""The Triton attention backend: the GPU fast path over the paged KV cache.

One forward = three launches at most: KV write (with the rotary of q and k fused in), decode
attention (its split-K merge included) over the first ``num_decodes`` sequences, prefill
attention over the rest. Nothing reads a device tensor on the host, and the decode launches
depend only on the batch shape (never on context lengths, the split-K grid included), so
pure-decode steps can be captured once and replayed.

One exception to the paged prefill kernel: a few long prompt chunks go to PyTorch's SDPA on
their K/V gathered from the cache. With nothing cached before them (a screenshot's first
prefill) that is cuDNN's causal kernel: 267 us over 4k tokens on an H200 against 449 us for our
paged kernel, worth the gather (2 x 2 MB) and the handful of launches. With a cached context
(the phone-agent workload's chunks: ~2k new tokens after ~2-5k of history, where the paged
kernel took ~30% of the GPU's time) the mask is causal from the lower right, which SDPA runs
through its flash or memory-efficient kernel; the self-check times that against the paged
kernel at start-up and keeps the faster (``context_prefill``).
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from autoglm_serve.kernels import fused_ops_enabled
from autoglm_serve.kernels.kv_write import rotate_and_write_kv_cache, write_kv_cache
from autoglm_serve.kernels.paged_attention import (DecodeSplit, decode_attention, decode_split,
                                                   prefill_attention)
from autoglm_serve.models.layers.attention import AttentionBackend, AttentionMetadata, Rope
from autoglm_serve.models.layers.torch_attention import gather_kv

logger = logging.getLogger(__name__)

# Prefill steps whose prefills are at most this many sequences, each at least this long and
# with no cached prefix, run their attention through SDPA (see the module docstring).
DENSE_PREFILL_MAX_SEQS = 4
DENSE_PREFILL_MIN_TOKENS = 1024


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
        # long chunks after a cached context: "sdpa" or "paged" (chosen by self_check)
        self.context_prefill = "paged"

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
        # off with the other fused kernels when their start-up self-check failed
        return fused_ops_enabled()

    def self_check(self, device: torch.device, dtype: torch.dtype, num_heads: int,
                   num_kv_heads: int, head_dim: int) -> bool:
        """Decode at these shapes against the PyTorch backend on random data: a lone long
        context (the small-batch split, its partitions merged in the kernel) and a batch with a
        padding row, each twice (the merge counters must have been reset)."""
        from autoglm_serve.models.layers.torch_attention import TorchAttentionBackend
        try:
            for lens in ([700], [1, 300, 700, 0]):
                q, k, v, cache, meta = _random_decodes(lens, num_heads, num_kv_heads, head_dim,
                                                      dtype, device)
                ref = TorchAttentionBackend().forward(q, k, v, cache.clone(), meta,
                                                      head_dim ** -0.5)
                for _ in range(2):
                    out = self.forward(q, k, v, cache.clone(), meta, head_dim ** -0.5)
                    err = (out.float() - ref.float()).norm() / ref.float().norm()
                    if not err < 2e-2:
                        logger.warning("Triton decode attention disagrees with PyTorch "
                                       "(relative error %.2e)", err)
                        return False
        except Exception as exc:  # a compile or launch failure
            logger.warning("Triton attention failed its self-check: %r", exc)
            return False
        self.context_prefill = self._faster_context_prefill(device, dtype, num_heads,
                                                            num_kv_heads, head_dim)
        return True

    def _faster_context_prefill(self, device, dtype, num_heads, num_kv_heads, head_dim) -> str:
        """SDPA or the paged kernel for long chunks after a cached context: SDPA if it agrees
        with the PyTorch backend and is faster at a phone-agent chunk (2,048 new tokens after
        4,096 cached), timed on the device. The paged kernel on CPU (Triton's interpreter)."""
        if device.type != "cuda":
            return "paged"
        from autoglm_serve.models.layers.torch_attention import TorchAttentionBackend
        scale = head_dim ** -0.5
        try:
            self.context_prefill = "sdpa"
            q, k, v, cache, meta = _random_prefill(1024, 700, num_heads, num_kv_heads,
                                                   head_dim, dtype, device)
            ref = TorchAttentionBackend().forward(q, k, v, cache.clone(), meta, scale)
            out = self.forward(q, k, v, cache.clone(), meta, scale)
            err = (out.float() - ref.float()).norm() / ref.float().norm()
            if not err < 2e-2:
                logger.warning("SDPA with a cached context disagrees with PyTorch (relative "
                               "error %.2e): long chunks stay on the paged kernel", err)
                return "paged"
            q, k, v, cache, meta = _random_prefill(2048, 4096, num_heads, num_kv_heads,
                                                   head_dim, dtype, device)
            ms = {}
            for mode in ("paged", "sdpa"):
                self.context_prefill = mode
                self.forward(q, k, v, cache, meta, scale)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(5):
                    self.forward(q, k, v, cache, meta, scale)
                end.record()
                end.synchronize()
                ms[mode] = start.elapsed_time(end) / 5
        except Exception as exc:  # no flash or memory-efficient kernel for these shapes
            logger.warning("SDPA with a cached context failed (%r): long chunks stay on the "
                           "paged kernel", exc)
            return "paged"
        choice = min(ms, key=ms.get)
        logger.info("prompt chunks after a cached context: %s (paged kernel %.3f ms, SDPA %.3f "
                    "ms for 2,048 tokens after 4,096)", choice, ms["paged"], ms["sdpa"])
        return choice

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
            plan = _prefill_plan(meta, self.context_prefill == "sdpa")
            if plan is None:
                prefill_attention(out, q, kv_cache, meta.block_tables, meta.seq_lens,
                                  meta.query_start_loc, scale, seq_offset=nd,
                                  num_seqs=meta.num_seqs - nd, max_query_len=meta.max_query_len)
            for seq, start, end, seq_len in plan or ():
                if seq_len is None:     # a short chunk of a step with long ones: paged alone
                    prefill_attention(out, q, kv_cache, meta.block_tables, meta.seq_lens,
                                      meta.query_start_loc, scale, seq_offset=seq, num_seqs=1,
                                      max_query_len=end - start)
                    continue
                keys, values = gather_kv(kv_cache, meta.block_tables[seq], seq_len)
                heads = [t.to(q.dtype).transpose(0, 1).unsqueeze(0)
                         for t in (q[start:end], keys, values)]
                if seq_len == end - start:
                    attended = F.scaled_dot_product_attention(*heads, is_causal=True, scale=scale,
                                                              enable_gqa=True)
                else:
                    attended = F.scaled_dot_product_attention(
                        *heads, attn_mask=causal_lower_right(end - start, seq_len), scale=scale,
                        enable_gqa=True)
                out[start:end] = attended[0].transpose(0, 1)
        return out


def _prefill_plan(meta: AttentionMetadata, with_context: bool
                  ) -> list[tuple[int, int, int, int | None]] | None:
    """(sequence, first row, end row, its context + chunk length, or None for the paged kernel)
    of every prefill of the step, when a few of them are long enough for SDPA: those starting
    from an empty cache, and with ``with_context`` those after a cached prefix too. None: the
    paged kernel takes them all in one launch."""
    first = meta.num_decodes
    if (meta.num_seqs - first > DENSE_PREFILL_MAX_SEQS
            or meta.max_query_len < DENSE_PREFILL_MIN_TOKENS):
        return None
    starts = meta.query_start_loc_cpu.tolist()
    seq_lens = meta.seq_lens_cpu.tolist()
    plan, dense = [], False
    for seq in range(first, meta.num_seqs):
        start, end = starts[seq], starts[seq + 1]
        long = end - start >= DENSE_PREFILL_MIN_TOKENS
        if long and (with_context or seq_lens[seq] == end - start):
            plan.append((seq, start, end, seq_lens[seq]))
            dense = True
        else:
            plan.append((seq, start, end, None))
    return plan if dense else None


def _random_prefill(query_len: int, context: int, num_heads: int, num_kv_heads: int,
                    head_dim: int, dtype: torch.dtype, device: torch.device,
                    block_size: int = 16):
    """One prompt chunk of query_len tokens after ``context`` cached ones, random K/V."""
    seq_len = context + query_len
    num_blocks = -(-seq_len // block_size)
    tables = torch.arange(num_blocks, dtype=torch.int32).view(1, num_blocks)
    starts = torch.tensor([0, query_len], dtype=torch.int32)
    lens = torch.tensor([seq_len], dtype=torch.int32)
    slots = torch.arange(context, seq_len, dtype=torch.int64)
    meta = AttentionMetadata(
        num_seqs=1, num_decodes=0, num_tokens=query_len, max_query_len=query_len,
        max_seq_len=seq_len, query_start_loc=starts.to(device), seq_lens=lens.to(device),
        block_tables=tables.to(device), slot_mapping=slots.to(device),
        query_start_loc_cpu=starts, seq_lens_cpu=lens)
    cache = torch.randn(2, num_blocks, num_kv_heads, block_size, head_dim, device=device,
                        dtype=dtype)
    q = torch.randn(query_len, num_heads, head_dim, device=device, dtype=dtype)
    k, v = torch.randn(2, query_len, num_kv_heads, head_dim, device=device, dtype=dtype)
    return q, k, v, cache, meta


def _random_decodes(seq_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype, device: torch.device, block_size: int = 16):
    """One decode step over random cached contexts (seq_len 0 = a padding row)."""
    n = len(seq_lens)
    max_blocks = -(-max(seq_lens) // block_size)
    tables = torch.arange(n * max_blocks, dtype=torch.int32).view(n, max_blocks)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    pos = (lens.long() - 1).clamp(min=0)    # the new token's
    slots = tables[torch.arange(n), pos // block_size].long() * block_size + pos % block_size
    slots[lens == 0] = -1
    starts = torch.arange(n + 1, dtype=torch.int32)
    meta = AttentionMetadata(
        num_seqs=n, num_decodes=n, num_tokens=n, max_query_len=1, max_seq_len=max(seq_lens),
        query_start_loc=starts.to(device), seq_lens=lens.to(device),
        block_tables=tables.to(device), slot_mapping=slots.to(device),
        query_start_loc_cpu=starts, seq_lens_cpu=lens)
    cache = torch.randn(2, n * max_blocks, num_kv_heads, block_size, head_dim, device=device,
                        dtype=dtype)
    q = torch.randn(n, num_heads, head_dim, device=device, dtype=dtype)
    k, v = torch.randn(2, n, num_kv_heads, head_dim, device=device, dtype=dtype)
    return q, k, v, cache, meta
