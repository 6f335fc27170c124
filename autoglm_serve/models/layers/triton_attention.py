"""The Triton attention backend: the GPU fast path over the paged KV cache.

One forward = three launches at most: KV write (with the rotary of q and k fused in), decode
attention (its split-K merge included) over the first ``num_decodes`` sequences, prefill
attention over the rest. A step of decodes alone is one launch: the decode kernel rotates and
writes the step's K/V itself (16 rows at 10k tokens of context: the write kernel's ~5.5 us a
layer saved, BENCHMARKS.md). Nothing reads a device tensor on the host, and the decode launches
depend only on the batch shape (never on context lengths, the split-K grid included), so
pure-decode steps can be captured once and replayed.

Prefill never goes to cuDNN's attention, though it is a little faster over contiguous K/V (301
against 330 us for 4k tokens on an H200): cuDNN builds a plan for every new shape, 55-70 ms
each there (torch 2.11, scripts/gpu/cudnn_shape_probe.py), and every new prompt length is one.
"""
from __future__ import annotations

import contextlib
import logging

import torch

from autoglm_serve.kernels import fused_ops_enabled
from autoglm_serve.kernels.kv_write import rotate_and_write_kv_cache, write_kv_cache
from autoglm_serve.kernels.paged_attention import (DecodeSplit, NewTokenKV, decode_attention,
                                                   decode_split)
from autoglm_serve.kernels.paged_prefill import prefill_attention
from autoglm_serve.models.layers.attention import AttentionBackend, AttentionMetadata, Rope

logger = logging.getLogger(__name__)


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the Triton interpreter on CPU: keep the split-K grid small but above one


class TritonAttentionBackend(AttentionBackend):
    name = "triton"
    # False: a batch of decodes too writes its K/V with the write kernel (a benchmark's A/B)
    fuse_decode_kv_write = True

    def __init__(self, max_decode_partitions: int = 64, fuse_decode_kv_write: bool | None = None):
        # Upper bound of the split-K grid (a power of two; see decode_split).
        assert max_decode_partitions & (max_decode_partitions - 1) == 0
        self.max_decode_partitions = max_decode_partitions
        if fuse_decode_kv_write is not None:
            self.fuse_decode_kv_write = fuse_decode_kv_write
        self._num_sms: dict[torch.device, int] = {}
        self._merge_counters: dict[torch.device, torch.Tensor] = {}
        # Outgrown counter buffers: CUDA graphs captured with them still use them.
        self._outgrown: list[torch.Tensor] = []

    @contextlib.contextmanager
    def kv_write_kernel(self):
        """Within, a step of decodes alone writes its K/V with the write kernel too, running
        the decode kernel's variant that mixed steps (decodes beside prompt chunks) run."""
        was = self.fuse_decode_kv_write
        self.fuse_decode_kv_write = False
        try:
            yield
        finally:
            self.fuse_decode_kv_write = was

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
        padding row, each twice (the merge counters must have been reset); then the decode
        kernel's own rotary and K/V write (GLM's interleaved pairs) against the write kernel's."""
        from autoglm_serve.models.layers.torch_attention import TorchAttentionBackend
        try:
            for lens in ([700], [1, 300, 700, 0]):
                q, k, v, cache, meta = _random_decodes(lens, num_heads, num_kv_heads, head_dim,
                                                      dtype, device)
                ref = TorchAttentionBackend().forward(q, k, v, cache.clone(), meta,
                                                      head_dim ** -0.5)
                for _ in range(2):
                    out = self.forward(q, k, v, cache.clone(), meta, head_dim ** -0.5)
                    if not _agrees(out, ref, "Triton decode attention disagrees with PyTorch"):
                        return False
            angles = torch.rand(len(lens), head_dim // 4, device=device) * 100
            rope = Rope(angles.cos(), angles.sin(), interleaved=True)
            slots = meta.slot_mapping[meta.slot_mapping >= 0]
            results = []
            for fused in (True, False):
                backend = TritonAttentionBackend(self.max_decode_partitions, fused)
                written = cache.clone()
                out = backend.forward(q.clone(), k, v, written, meta, head_dim ** -0.5,
                                      rope=rope)
                block_size = written.shape[3]
                results.append((out, written[:, slots // block_size, :, slots % block_size]))
            # compiled, the two kernels may contract a rotation's product and sum into one FMA
            # at different places: within rounding of each other, not bit for bit
            if not (_agrees(results[0][1], results[1][1], "The decode kernel's K/V write "
                            "disagrees with the write kernel's")
                    and _agrees(results[0][0], results[1][0], "The decode kernel's rotary "
                                "disagrees with the KV write kernel's")):
                return False
        except Exception as exc:  # a compile or launch failure
            logger.warning("Triton attention failed its self-check: %r", exc)
            return False
        return True

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float, out: torch.Tensor | None = None,
                rope: Rope | None = None) -> torch.Tensor:
        """As AttentionBackend.forward; ``out`` ([T, H, D]) lets a caller (a CUDA graph, a test
        that poisons it) own the output buffer. With ``rope``, q and k come un-rotated and k is
        rotated on its way into the cache; q's contents afterwards are unspecified (rotated in
        place unless the decode kernel did the write)."""
        nd = meta.num_decodes
        new_kv = None
        if nd == meta.num_tokens and self.fuse_decode_kv_write:
            new_kv = NewTokenKV(k, v, meta.slot_mapping, None, None, False) if rope is None \
                else NewTokenKV(k, v, meta.slot_mapping, rope.cos, rope.sin, rope.interleaved)
        elif rope is None:
            write_kv_cache(k, v, kv_cache, meta.slot_mapping)
        else:
            rotate_and_write_kv_cache(q, k, v, kv_cache, meta.slot_mapping, rope.cos, rope.sin,
                                      rope.interleaved)
        if out is None:
            out = torch.empty_like(q)
        if nd > 0:
            num_kv_heads = kv_cache.shape[2]
            decode_attention(out[:nd], q[:nd], kv_cache, meta.block_tables[:nd],
                             meta.seq_lens[:nd], scale,
                             self.decode_split(nd, num_kv_heads, q.device),
                             self.merge_counters(nd * num_kv_heads, q.device), new_kv=new_kv)
        if meta.num_seqs > nd:
            prefill_attention(out, q, kv_cache, meta.block_tables, meta.seq_lens,
                              meta.query_start_loc, scale, seq_offset=nd,
                              num_seqs=meta.num_seqs - nd, max_query_len=meta.max_query_len)
        return out


def _agrees(out: torch.Tensor, ref: torch.Tensor, problem: str) -> bool:
    err = (out.float() - ref.float()).norm() / ref.float().norm()
    if not err < 2e-2:
        logger.warning("%s (relative error %.2e)", problem, err)
        return False
    return True


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
