"""Triton kernels for attention over the paged KV cache: decode here, prefill in
kernels/paged_prefill.py, and what both use (the online-softmax loop over a block table's
tokens, the pipeline depth, the kernels' compile-time shapes).

Cache layout (see models/layers/attention.py):
``[2, num_blocks, num_kv_heads, block_size, head_dim]``, this step's K/V already written to it
(kernels/kv_write.py), or, for a batch of decodes alone, written by the decode kernel itself.

``decode_attention``: one query token per sequence. A program owns one (sequence, KV head,
context partition) and puts the whole GQA group of query heads in the M dim of ``tl.dot``, so each
K/V tile is read from HBM once for all heads sharing it. Long contexts are split into partitions
(split-K) whose partial results the last of them to finish merges by log-sum-exp (an atomic
counter per sequence and KV head tells it that it is last): one launch.

Softmax runs in the log2 domain (``exp2`` with the scale pre-multiplied by log2(e)): exp2 is the
native instruction. Accumulation is fp32 whatever the input dtype.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from autoglm_serve.kernels import next_power_of_2, pdl
from autoglm_serve.kernels.kv_write import load_rotated
from autoglm_serve.kernels.pdl import let_dependents_launch, wait_for_previous_grid

LOG2E = 1.4426950408889634

# A decode partition covers at least MIN_CHUNK tokens so that the split-K partial results (fp32,
# one row per head) stay small next to the KV they replace (small batches, which leave SMs idle,
# go down to one tile: see decode_split).
DECODE_MIN_CHUNK = 256


class DecodeTiles(NamedTuple):
    """The decode kernel's shape: tile_n context tokens x head_dim per K/V load, its warps and
    pipeline depth, and parts_scale times the partition count that balances the KV each
    partition reads against the partial rows its merge reads (see _partitioning); fill_programs:
    also at most the partitions that give each SM that many programs (None: the grid's width);
    merge_tile: the partial rows the merging program loads at once (_merge_partitions)."""
    tile_n: int
    num_warps: int
    num_stages: int | None = None   # None: as many K/V tiles in flight as shared memory holds
    parts_scale: float = 1.0
    fill_programs: float | None = None
    merge_tile: int = 4


# 64 tokens a tile in 2 warps (scripts/gpu/decode_tiles_sweep.py on an H200, 98 shapes, one
# layer as a graph replay): 16 rows at 10k tokens 59.5 us against 69.7 in 4 warps, at 4k 26.8
# against 30.7, 64 x 4k and 256 x 1k 2% faster, one row at 10k the same. At most 3 programs
# per SM (seventh session's sweep): 16 x 10k 59.3 -> 50.4 us, 64 x 4k 75.2 -> 69.7, 256 x 1k
# 75.4 -> 65.8 (one partition, no merge), 1 x 10k and 16 x 4k within 0.5 us; 4, 5, 6 and 8
# a SM lost at 64 x 4k (85.1, 78.8, 74.5, 73.9).
DECODE_TILES = DecodeTiles(64, 2, fill_programs=3)

# A batch of at most SMALL_BATCH_PAIRS (sequence, KV head) pairs (AutoGLM: 2 sequences) leaves
# most SMs idle whatever the split, so its time is the latency of a program's chain of loads:
# 8 warps a program, 2 stages and twice the partitions take it down (decode_tiles_sweep.py on
# the H200, fifteenth session, one layer: 1 x 512 7.3 -> 5.8 us, 1 x 4k 12.4 -> 10.2, 1 x 10k
# 18.2 -> 14.3, 2 x 2k 10.6 -> 8.5). In the engine one row's decode step at 4,000 tokens went
# 5.16 -> 5.10 ms; 4 rows' went 5.52 -> 5.58 (and 16 x 4k lost in the sweep, 26.6 -> 33.3).
SMALL_BATCH_PAIRS = 4
SMALL_BATCH_DECODE_TILES = DecodeTiles(64, 8, num_stages=2, parts_scale=2.0)
# One sequence's merge loads 16 partial rows at once, not 4 (decode_tiles_sweep.py
# --merge-tile on an H100, twenty-eighth session, one layer: 1 x 1k 6.3 -> 5.7 us, 1 x 4k
# 9.9 -> 8.2, 1 x 10k 14.5 -> 12.5; in the engine, Open-AutoGLM's sampling, a decode step at
# 4k 6.72 -> 6.61 ms, at 10k 6.95 -> 6.83). Two sequences' steps at 10k lost (7.31 -> 7.43 ms:
# the wider merge's registers), and the large batches' one-layer times with 8 or 16.
ONE_SEQUENCE_DECODE_TILES = SMALL_BATCH_DECODE_TILES._replace(merge_tile=16)


def pipeline_stages(kv_tile_bytes: int, resident_bytes: int = 0) -> int:
    """Pipeline depth: as many K+V tiles in flight as fit in ~160 KB of the SM's shared memory
    (228 KB on Hopper, less elsewhere) next to what stays resident (the Q tile), at most 3."""
    return max(1, min(3, (160 * 1024 - resident_bytes) // (2 * kv_tile_bytes)))


def dot_precision(dtype: torch.dtype) -> str:
    # fp32 callers want fp32 accuracy (tests compare at 1e-4): no tf32 truncation in the dots.
    return "ieee" if dtype == torch.float32 else "tf32"


class KernelShape(NamedTuple):
    """A launch's compile-time shape: the kernel's constexprs, warps and pipeline depth (the
    launchers use it, and so does scripts/attention_shared_memory.py, which compiles it)."""
    constexprs: dict
    num_warps: int
    num_stages: int


# ----------------------------------------------------------------------------------------------
# Shared inner loop: online softmax over a range of context tokens read through a block table
# ----------------------------------------------------------------------------------------------

@triton.jit
def attend_range(acc, l_i, m_i, q, k_base, v_base, table_row, q_pos, lo, hi, scale_log2,
                 stride_c_block, stride_c_tok,
                 CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    """Fold context tokens [lo, hi) into the running (acc, l_i, m_i) of the rows of q.

    Token n lives in page table_row[n // BLOCK_SIZE] at offset n % BLOCK_SIZE; looking the page
    up per token lets a tile span several small pages (block size 16) or part of a large one.
    Tokens >= hi are masked out of the loads, not just the scores: unused cache slots may hold
    anything (NaN included) and 0 * NaN would leak into acc.
    """
    d = tl.arange(0, BLOCK_D)
    for start in range(lo, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_mask = n < hi
        page = tl.load(table_row + n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        tok = page * stride_c_block + (n % BLOCK_SIZE) * stride_c_tok
        if BLOCK_D == HEAD_DIM:
            kv_mask = n_mask[:, None]
        else:
            kv_mask = n_mask[:, None] & (d[None, :] < HEAD_DIM)
        # an fp8 cache (--kv-cache-dtype fp8) is widened to q's dtype for the dot
        k = tl.load(k_base + tok[:, None] + d[None, :], mask=kv_mask, other=0.0).to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        if CAUSAL:
            s = tl.where((n[None, :] <= q_pos[:, None]) & n_mask[None, :], s, float("-inf"))
        else:
            s = tl.where(n_mask[None, :], s, float("-inf"))
        # Every row has seen at least one visible key before (or in) its first tile, so m_new is
        # finite and exp2(-inf - m_new) = 0 handles the masked entries.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + tok[:, None] + d[None, :], mask=kv_mask, other=0.0).to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


# ----------------------------------------------------------------------------------------------
# Decode: split-K over context partitions, merged by the last partition to finish
# ----------------------------------------------------------------------------------------------

class DecodeSplit(NamedTuple):
    partitions: int     # split-K grid width: programs per (sequence, KV head), a power of two
    min_chunk: int      # fewest context tokens per partition
    num_sms: int        # the GPU's, for DecodeTiles.fill_programs
    tiles: DecodeTiles = DECODE_TILES


def decode_split(num_seqs: int, num_kv_heads: int, num_sms: int,
                 max_partitions: int = 64) -> DecodeSplit:
    """The split-K shape from the batch shape alone: enough (sequence, KV head, partition)
    programs for ~4 per SM. It deliberately ignores the context lengths, so an eager warm-up
    compiles the very kernels that a CUDA graph captures and replays for any later lengths;
    partitions a short context does not need exit at once (see _partitioning).

    A batch with fewer (sequence, KV head) pairs than SMs cannot fill the GPU with whole
    contexts: its partitions go down to a single tile, so that at batch 1 a 700-token context of
    AutoGLM (2 KV heads) reads its KV with 2 x 6 programs rather than 2 x 3. The tiles too
    follow the batch: ONE_SEQUENCE_DECODE_TILES for one sequence, SMALL_BATCH_DECODE_TILES up
    to SMALL_BATCH_PAIRS pairs."""
    pairs = max(1, num_seqs * num_kv_heads)
    want = math.ceil(4 * num_sms / pairs)
    partitions = max(1, min(next_power_of_2(want), max_partitions))
    if num_seqs == 1:
        tiles = ONE_SEQUENCE_DECODE_TILES
    elif pairs <= SMALL_BATCH_PAIRS:
        tiles = SMALL_BATCH_DECODE_TILES
    else:
        tiles = DECODE_TILES
    min_chunk = tiles.tile_n if pairs < num_sms else DECODE_MIN_CHUNK
    return DecodeSplit(partitions, min_chunk, num_sms, tiles)


@triton.jit
def _partitioning(seq_len, parts_scale, max_parts, NUM_PARTS: tl.constexpr,
                  MIN_CHUNK: tl.constexpr, TILE_N: tl.constexpr, MERGE_RATIO: tl.constexpr):
    """How a context of seq_len tokens splits: (partitions used, tokens per partition).

    Computed on the device from seq_len alone, so the grid (NUM_PARTS programs per sequence and
    head) is static for CUDA graphs while short contexts still use few partitions; the chunk is a
    multiple of TILE_N so no tile straddles two partitions. With p partitions each program reads
    seq_len / p tokens of KV and then the merging one reads p partial rows: their sum is least
    at p = sqrt(seq_len / MERGE_RATIO), MERGE_RATIO being a partial row's bytes over a token's KV
    bytes, and more partitions than that make the step slower. parts_scale scales that count
    (DecodeTiles): the merge runs after the last partition, so bytes alone do not price it."""
    balanced = (parts_scale * tl.sqrt(seq_len.to(tl.float32) / MERGE_RATIO)).to(tl.int32) + 1
    wanted = tl.minimum(tl.minimum(tl.cdiv(seq_len, MIN_CHUNK), max_parts), balanced)
    chunk = tl.cdiv(tl.cdiv(seq_len, wanted), TILE_N) * TILE_N
    return tl.cdiv(seq_len, chunk), chunk


@triton.jit
def _merge_partitions(part_out_ptr, part_lse_ptr, rows, num_parts, stride_pp, row_mask,
                      BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                      NUM_PARTS: tl.constexpr, MERGE_TILE: tl.constexpr):
    """sum_p exp2(lse_p - lse) * out_p with lse = log2 sum_p exp2(lse_p): the exact softmax over
    the union of the partitions, for the heads whose partial rows start at ``rows``.

    Loads bypass L1 (.cg): the partials were written by other SMs, and the atomic that told this
    program it is the last orders those writes before these reads only at the L2."""
    p = tl.arange(0, NUM_PARTS)
    lse = tl.load(part_lse_ptr + rows[:, None] + p[None, :] * stride_pp,
                  mask=row_mask[:, None] & (p[None, :] < num_parts), other=float("-inf"),
                  cache_modifier=".cg")
    lse_max = tl.where(row_mask, tl.max(lse, 1), 0.0)
    d = tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    weight_sum = tl.zeros([BLOCK_G], tl.float32)
    # MERGE_TILE partitions per load: several rows in flight at once from the L2
    for first in range(0, num_parts, MERGE_TILE):
        pt = first + tl.arange(0, MERGE_TILE)
        mask = row_mask[:, None] & (pt[None, :] < num_parts)
        part_rows = rows[:, None] + pt[None, :] * stride_pp
        w = tl.exp2(tl.load(part_lse_ptr + part_rows, mask=mask, other=float("-inf"),
                            cache_modifier=".cg") - lse_max[:, None])
        parts = tl.load(part_out_ptr + part_rows[:, :, None] * HEAD_DIM + d[None, None, :],
                        mask=mask[:, :, None] & (d[None, None, :] < HEAD_DIM), other=0.0,
                        cache_modifier=".cg")
        acc += tl.sum(parts * w[:, :, None], 1)
        weight_sum += tl.sum(w, 1)
    return acc / tl.where(row_mask, weight_sum, 1.0)[:, None]


@triton.jit
def _fold_new_token(acc, l_i, m_i, q, k_new_ptr, v_new_ptr, slot_ptr, cache_ptr, seq, kv_head, d,
                    cos_row, sin_row, scale_log2, stride_kt, stride_kh, stride_vt, stride_vh,
                    stride_cos_f, stride_sin_f, stride_c_kv, stride_c_block, stride_c_head,
                    stride_c_tok, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                    ROTARY_HALF: tl.constexpr, INTERLEAVED: tl.constexpr):
    """The step's own token (last position) into the running softmax of q's rows, from
    registers, and its K/V into its cache slot. The values attended are the cache's (an fp8
    cache rounds them), as if the kernel had read them back."""
    d_mask = d < HEAD_DIM
    k = load_rotated(k_new_ptr + seq.to(tl.int64) * stride_kt + kv_head * stride_kh, d, d_mask,
                     cos_row, sin_row, stride_cos_f, stride_sin_f, ROTARY_HALF, INTERLEAVED)
    v = tl.load(v_new_ptr + seq.to(tl.int64) * stride_vt + kv_head * stride_vh + d, mask=d_mask,
                other=0.0)
    cache_ty = cache_ptr.dtype.element_ty
    k = k.to(cache_ty)
    v = v.to(cache_ty)
    # slot -1: nothing written (a CUDA graph's capture runs its rows with a context and no slot)
    slot = tl.load(slot_ptr + seq)
    dst = (cache_ptr + (slot // BLOCK_SIZE) * stride_c_block + kv_head * stride_c_head
           + (slot % BLOCK_SIZE) * stride_c_tok + d)
    tl.store(dst, k, mask=d_mask & (slot >= 0))
    tl.store(dst + stride_c_kv, v, mask=d_mask & (slot >= 0))
    s = tl.sum(q.to(tl.float32) * k.to(q.dtype).to(tl.float32)[None, :], 1) * scale_log2
    m_new = tl.maximum(m_i, s)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new)
    # p is rounded to the value dtype before its product, as in attend_range's dot
    pv = p.to(q.dtype).to(tl.float32)[:, None] * v.to(q.dtype).to(tl.float32)[None, :]
    return acc * alpha[:, None] + pv, l_i * alpha + p, m_new


# The block table of an eager step is as wide as its longest sequence: its row stride changes
# from step to step, and a specialization on it (1, a multiple of 16, other) would compile the
# kernel again (~1 s, all running requests stalled) the first time a serving step meets a class.
# (An M-RoPE table's strides follow the step's token count: likewise unspecialized.)
@triton.jit(do_not_specialize=["stride_bt", "max_parts", "stride_cos_t", "stride_cos_f",
                               "stride_sin_t", "stride_sin_f"])
def _decode_kernel(out_ptr, part_out_ptr, part_lse_ptr, counters_ptr, q_ptr, cache_ptr,
                   block_tables_ptr, seq_lens_ptr, scale_log2, parts_scale, max_parts,
                   stride_qt, stride_qh, stride_ot, stride_oh,
                   stride_c_kv, stride_c_block, stride_c_head, stride_c_tok, stride_bt,
                   stride_ps, stride_ph, stride_pp,
                   k_new_ptr, v_new_ptr, slot_ptr, cos_ptr, sin_ptr,
                   stride_kt, stride_kh, stride_vt, stride_vh,
                   stride_cos_t, stride_cos_f, stride_sin_t, stride_sin_f,
                   GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr,
                   NUM_PARTS: tl.constexpr, MIN_CHUNK: tl.constexpr, MERGE_RATIO: tl.constexpr,
                   MERGE_TILE: tl.constexpr, PRECISION: tl.constexpr, WRITE_KV: tl.constexpr,
                   ROTARY_HALF: tl.constexpr, INTERLEAVED: tl.constexpr, PDL: tl.constexpr):
    """With WRITE_KV the step's own token is not in the cache yet: q and the new k come
    un-rotated (rotated here in registers when ROTARY_HALF > 0), the partition holding the last
    position folds that token in from registers and writes its K and V to the cache slot
    (unless -1); the other partitions read only cached tokens. One launch a layer where there
    were two."""
    wait_for_previous_grid(PDL)
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kv_head * GROUP + g
    io_mask = (g[:, None] < GROUP) & (d[None, :] < HEAD_DIM)
    out_ptrs = out_ptr + seq.to(tl.int64) * stride_ot + heads[:, None] * stride_oh + d[None, :]

    seq_len = tl.load(seq_lens_ptr + seq)
    if seq_len <= 0:
        # Padding row of a CUDA-graph batch: defined output (zeros), no KV read.
        if part == 0:
            tl.store(out_ptrs, tl.zeros([BLOCK_G, BLOCK_D], out_ptr.dtype.element_ty), mask=io_mask)
        return
    num_parts, chunk = _partitioning(seq_len, parts_scale, max_parts, NUM_PARTS, MIN_CHUNK,
                                     TILE_N, MERGE_RATIO)
    lo = part * chunk
    if lo >= seq_len:
        return  # this sequence is too short for this many partitions
    hi = tl.minimum(lo + chunk, seq_len)

    q_base = q_ptr + seq.to(tl.int64) * stride_qt + heads[:, None] * stride_qh
    if WRITE_KV:
        cos_row = cos_ptr + seq.to(tl.int64) * stride_cos_t
        sin_row = sin_ptr + seq.to(tl.int64) * stride_sin_t
        q = load_rotated(q_base, d[None, :], io_mask, cos_row, sin_row, stride_cos_f,
                         stride_sin_f, ROTARY_HALF, INTERLEAVED)
        holds_new = hi == seq_len
        hi_cached = tl.where(holds_new, seq_len - 1, hi)
    else:
        q = tl.load(q_base + d[None, :], mask=io_mask, other=0.0)
        hi_cached = hi
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    k_base = cache_ptr + kv_head * stride_c_head
    acc, l_i, m_i = attend_range(acc, l_i, m_i, q, k_base, k_base + stride_c_kv,
                                 block_tables_ptr + seq.to(tl.int64) * stride_bt, m_i, lo,
                                 hi_cached, scale_log2, stride_c_block, stride_c_tok,
                                 False, TILE_N, BLOCK_SIZE, HEAD_DIM, BLOCK_D, PRECISION)
    let_dependents_launch(PDL)
    if WRITE_KV:
        if holds_new:
            acc, l_i, m_i = _fold_new_token(acc, l_i, m_i, q, k_new_ptr, v_new_ptr, slot_ptr,
                                            cache_ptr, seq, kv_head, d, cos_row, sin_row,
                                            scale_log2, stride_kt, stride_kh, stride_vt,
                                            stride_vh, stride_cos_f, stride_sin_f, stride_c_kv,
                                            stride_c_block, stride_c_head, stride_c_tok,
                                            HEAD_DIM, BLOCK_SIZE, ROTARY_HALF, INTERLEAVED)
    o = acc / l_i[:, None]
    if NUM_PARTS == 1:
        tl.store(out_ptrs, o.to(out_ptr.dtype.element_ty), mask=io_mask)
    else:
        if num_parts == 1:
            tl.store(out_ptrs, o.to(out_ptr.dtype.element_ty), mask=io_mask)
        else:
            # Partial result normalised by its own sum, plus its log2-sum-exp2 for the merge.
            rows = seq.to(tl.int64) * stride_ps + heads * stride_ph
            part_rows = rows + part * stride_pp
            tl.store(part_out_ptr + part_rows[:, None] * HEAD_DIM + d[None, :], o, mask=io_mask)
            tl.store(part_lse_ptr + part_rows, m_i + tl.log2(l_i), mask=g < GROUP)
            # The last partition of this (sequence, KV head) to finish merges them all. The
            # barrier puts every thread's partial stores before the counter's release (acq_rel,
            # GPU scope); that program resets the counter for the next launch (graph replays).
            tl.debug_barrier()
            counter = counters_ptr + seq * tl.num_programs(1) + kv_head
            finished = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            if finished == num_parts - 1:
                tl.store(counter, 0)
                merged = _merge_partitions(part_out_ptr, part_lse_ptr, rows, num_parts,
                                           stride_pp, g < GROUP, BLOCK_G, HEAD_DIM, BLOCK_D,
                                           NUM_PARTS, MERGE_TILE)
                tl.store(out_ptrs, merged.to(out_ptr.dtype.element_ty), mask=io_mask)


class NewTokenKV(NamedTuple):
    """A decode step's own K and V ([N, Hkv, D], last dim contiguous), for the decode kernel to
    write to ``slot_mapping`` ([N] int64, -1 = padding row) itself; with cos/sin ([N, half]
    float32, any strides; None: no rotary) q and k come un-rotated and are rotated as
    kernels/kv_write.py does, pairs interleaved or half-split."""
    k: torch.Tensor
    v: torch.Tensor
    slot_mapping: torch.Tensor
    cos: torch.Tensor | None
    sin: torch.Tensor | None
    interleaved: bool


def decode_attention(out: torch.Tensor, q: torch.Tensor, kv_cache: torch.Tensor,
                     block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                     split: DecodeSplit, counters: torch.Tensor,
                     tiles: DecodeTiles | None = None, new_kv: NewTokenKV | None = None) -> None:
    """One query token per sequence, one launch. out, q: [N, H, D]; block_tables
    [N, max_blocks] int32; seq_lens [N] int32 (0 = padding row, output zeros). ``split`` fixes
    the grid (see decode_split); each sequence uses as many partitions as its length warrants,
    so the launch is the same for every step of a CUDA graph; ``tiles`` (None: the split's)
    is for sweeps. ``counters``: int32, at least
    N * num_kv_heads elements, all zero, left zero (a persistent buffer: graphs replay with it).
    Without ``new_kv`` the step's K/V are already in the cache (and q rotated); with it the
    kernel writes them (q is left as it came)."""
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads, block_size = kv_cache.shape[2], kv_cache.shape[3]
    if num_seqs == 0:
        return
    num_partitions = split.partitions
    tiles = tiles or split.tiles
    assert num_partitions == next_power_of_2(num_partitions)
    assert counters.dtype == torch.int32 and counters.numel() >= num_seqs * num_kv_heads
    rotary_half = 0
    if new_kv is not None:
        k, v = new_kv.k, new_kv.v
        assert k.stride(-1) == 1 and v.stride(-1) == 1 and kv_cache.stride(-1) == 1
        if new_kv.cos is not None:
            rotary_half = new_kv.cos.shape[-1]
            cos, sin = new_kv.cos, new_kv.sin
        else:
            cos = sin = k    # unread
        new_args = (k, v, new_kv.slot_mapping, cos, sin, k.stride(0), k.stride(1), v.stride(0),
                    v.stride(1), *(cos.stride() + sin.stride() if rotary_half else (0,) * 4))
    else:
        new_args = (q, q, seq_lens, q, q) + (0,) * 8    # unread
    shape = decode_shape(num_heads, num_kv_heads, head_dim, block_size, q.dtype, kv_cache.dtype,
                         split, tiles, new_kv is not None, rotary_half,
                         new_kv is not None and new_kv.interleaved)
    if num_partitions > 1:
        part_out = torch.empty((num_seqs, num_heads, num_partitions, head_dim),
                               dtype=torch.float32, device=q.device)
        part_lse = torch.empty((num_seqs, num_heads, num_partitions), dtype=torch.float32,
                               device=q.device)
    else:
        part_out = part_lse = torch.empty(0, dtype=torch.float32, device=q.device)
    # Partial-result strides ([N, H, P] rows of HEAD_DIM values).
    stride_ps, stride_ph, stride_pp = num_heads * num_partitions, num_partitions, 1
    _decode_kernel[(num_seqs, num_kv_heads, num_partitions)](
        out, part_out, part_lse, counters, q, kv_cache, block_tables, seq_lens, scale * LOG2E,
        tiles.parts_scale, _max_parts(num_seqs * num_kv_heads, split, tiles),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        block_tables.stride(0), stride_ps, stride_ph, stride_pp, *new_args, **shape.constexprs,
        num_warps=shape.num_warps, num_stages=shape.num_stages, **pdl.launch_options(q.device))


def _max_parts(pairs: int, split: DecodeSplit, tiles: DecodeTiles) -> int:
    if tiles.fill_programs is None:
        return split.partitions
    return max(1, min(split.partitions, math.ceil(tiles.fill_programs * split.num_sms / pairs)))


@functools.cache
def decode_shape(num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                 q_dtype: torch.dtype, kv_dtype: torch.dtype, split: DecodeSplit,
                 tiles: DecodeTiles | None = None, write_kv: bool = False,
                 rotary_half: int = 0, interleaved: bool = False) -> KernelShape:
    """The decode kernel's constexprs (all but PDL, which the device decides), warps and
    stages for these heads, cache and split, and whether it writes the step's K/V (with how
    many rotary pairs a head, see NewTokenKV)."""
    tiles = tiles or split.tiles
    group = num_heads // num_kv_heads
    block_d = next_power_of_2(head_dim)
    constexprs = dict(
        GROUP=group, BLOCK_G=max(16, next_power_of_2(group)), HEAD_DIM=head_dim, BLOCK_D=block_d,
        BLOCK_SIZE=block_size, TILE_N=tiles.tile_n, NUM_PARTS=split.partitions,
        MIN_CHUNK=split.min_chunk,
        # a partial row (fp32, per query head) against a token's K and V (per KV head)
        MERGE_RATIO=(4 * group) / (2 * kv_dtype.itemsize),
        MERGE_TILE=min(tiles.merge_tile, split.partitions), PRECISION=dot_precision(q_dtype),
        WRITE_KV=write_kv, ROTARY_HALF=rotary_half, INTERLEAVED=interleaved)
    stages = tiles.num_stages or pipeline_stages(tiles.tile_n * block_d * kv_dtype.itemsize)
    return KernelShape(constexprs, tiles.num_warps, stages)
