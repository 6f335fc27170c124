"""Prefill attention over the paged KV cache (Triton): varlen causal attention of each
sequence's new queries against its whole context (cached prefix + new tokens, all read through
the block table after this step's K/V were written, kernels/kv_write.py), which is what chunked
prefill and prefix caching need. Rows of a program are (token, head of the GQA group) pairs, so
one K/V tile feeds every head of the group. Where a page holds whole key tiles (--block-size 64
or 128) on a Hopper or later GPU, each K/V tile is one box that the TMA unit copies
(``_attend_pages``); smaller pages are gathered token by token (paged_attention.attend_range,
which the decode kernel shares).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from autoglm_serve.kernels import next_power_of_2
from autoglm_serve.kernels.paged_attention import (LOG2E, KernelShape, attend_range,
                                                   dot_precision, pipeline_stages)


class PrefillTiles(NamedTuple):
    """The prefill kernel's tile: block_m rows of (token, head) pairs against block_n keys."""
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int | None = None   # None: as many K/V tiles in flight as shared memory holds


# 128 rows against 64 keys in 4 warps (scripts/gpu/prefill_tiles_sweep.py on an H200, 55 tiles:
# 1.40x faster in total than the same tile in 8 warps over the phone agents' chunks, e.g. 2k
# tokens after 4k cached 385 against 548 us; 3 or 4 stages within 0.3% of each other).
PREFILL_TILES = PrefillTiles(128, 64, 4)
# The same tile in 2 stages where K/V come by TMA from pages of 64 or more tokens
# (.scratch/prefill_tma_ab.py on an H100, 7 of the phone agents' chunks, one layer: 2,386 us
# against 2,584 in 3 stages and 2,569 in 4; 8 warps 3,013; pages of 128 with 128-key tiles
# 2,597; and against 2,670 gathering pages of 16 token by token, 2,950 pages of 64).
PREFILL_TMA_TILES = PrefillTiles(128, 64, 4, 2)


@triton.jit
def _attend_pages(acc, l_i, m_i, q, kv_desc, table_row, q_pos, seq_len, head_row, v_rows, lo,
                  hi, scale_log2, stride_page_rows, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_SIZE: tl.constexpr, PRECISION: tl.constexpr):
    """attend_range for pages of at least BLOCK_N tokens: a tile lies inside one page, whose
    K (and V) rows are one box of the cache seen as [rows, head_dim], loaded by the TMA unit
    (no per-token addresses in registers). Token n's row: head_row + page * stride_page_rows +
    n % BLOCK_SIZE; V's are v_rows further. The box is loaded whole, so slots past the context
    reach the registers: the causal tiles zero their V (p = 0 there, but 0 * NaN is NaN)."""
    for start in range(lo, hi, BLOCK_N):
        page = tl.load(table_row + start // BLOCK_SIZE)
        row = head_row + page * stride_page_rows + start % BLOCK_SIZE
        k = kv_desc.load([row, 0]).to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        if CAUSAL:
            n = start + tl.arange(0, BLOCK_N)
            s = tl.where(n[None, :] <= q_pos[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = kv_desc.load([row + v_rows, 0]).to(q.dtype)
        if CAUSAL:
            v = tl.where((n < seq_len)[:, None], v, 0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


# seq_offset (the step's decode count), num_q_tiles and the block table's row stride change
# every step: left unspecialized, or each new value class (1, a multiple of 16, other) would
# compile the kernel again (~1 s) in the middle of serving.
@triton.jit(do_not_specialize=["seq_offset", "num_q_tiles", "stride_bt", "v_rows"])
def _prefill_kernel(out_ptr, q_ptr, cache_ptr, kv_desc, block_tables_ptr, seq_lens_ptr,
                    query_start_loc_ptr, scale_log2, seq_offset, num_q_tiles,
                    stride_qt, stride_qh, stride_ot, stride_oh,
                    stride_c_kv, stride_c_block, stride_c_head, stride_c_tok, stride_bt,
                    v_rows, stride_page_rows, stride_head_rows,
                    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_Q: tl.constexpr,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr):
    """TMA: K/V tiles through kv_desc, the cache as [rows, HEAD_DIM] (see _attend_pages; the
    row strides are the cache's in rows), else through per-token pointers from cache_ptr."""
    # Late query tiles see the most keys: launch them first so the short ones fill the tail.
    q_tile = num_q_tiles - 1 - tl.program_id(0)
    seq = seq_offset + tl.program_id(1)
    kv_head = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    first = q_tile * BLOCK_Q
    if first >= q_len:
        return

    # Row r of the tile is token first + r // BLOCK_G, head kv_head * GROUP + r % BLOCK_G.
    r = tl.arange(0, BLOCK_Q * BLOCK_G)
    tok = first + r // BLOCK_G
    g = r % BLOCK_G
    d = tl.arange(0, BLOCK_D)
    row_mask = (tok < q_len) & (g < GROUP)
    io_mask = row_mask[:, None] & (d[None, :] < HEAD_DIM)
    rows = (q_start + tok).to(tl.int64)
    heads = kv_head * GROUP + g
    out_ptrs = out_ptr + rows[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :]

    seq_len = tl.load(seq_lens_ptr + seq)
    if seq_len <= 0:
        tl.store(out_ptrs, tl.zeros([BLOCK_Q * BLOCK_G, BLOCK_D], out_ptr.dtype.element_ty),
                 mask=io_mask)
        return
    # Query i of the sequence sits at absolute position seq_len - q_len + i.
    context = seq_len - q_len
    q_pos = context + tok
    first_pos = context + first
    last_pos = context + tl.minimum(first + BLOCK_Q, q_len) - 1

    q = tl.load(q_ptr + rows[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :],
                mask=io_mask, other=0.0)
    acc = tl.zeros([BLOCK_Q * BLOCK_G, BLOCK_D], tl.float32)
    l_i = tl.zeros([BLOCK_Q * BLOCK_G], tl.float32)
    m_i = tl.full([BLOCK_Q * BLOCK_G], float("-inf"), tl.float32)
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    # Keys up to first_pos are visible to every row: whole tiles of them skip the causal mask;
    # only the tiles around the diagonal pay for it.
    full_end = (first_pos + 1) // BLOCK_N * BLOCK_N
    if TMA:
        head_row = kv_head * stride_head_rows
        acc, l_i, m_i = _attend_pages(acc, l_i, m_i, q, kv_desc, table_row, q_pos, seq_len,
                                      head_row, v_rows, 0, full_end, scale_log2,
                                      stride_page_rows, False, BLOCK_N, BLOCK_SIZE, PRECISION)
        acc, l_i, m_i = _attend_pages(acc, l_i, m_i, q, kv_desc, table_row, q_pos, seq_len,
                                      head_row, v_rows, full_end, last_pos + 1, scale_log2,
                                      stride_page_rows, True, BLOCK_N, BLOCK_SIZE, PRECISION)
    else:
        k_base = cache_ptr + kv_head * stride_c_head
        acc, l_i, m_i = attend_range(acc, l_i, m_i, q, k_base, k_base + stride_c_kv, table_row,
                                     q_pos, 0, full_end, scale_log2, stride_c_block,
                                     stride_c_tok,
                                     False, BLOCK_N, BLOCK_SIZE, HEAD_DIM, BLOCK_D, PRECISION)
        acc, l_i, m_i = attend_range(acc, l_i, m_i, q, k_base, k_base + stride_c_kv, table_row,
                                     q_pos, full_end, last_pos + 1, scale_log2, stride_c_block,
                                     stride_c_tok,
                                     True, BLOCK_N, BLOCK_SIZE, HEAD_DIM, BLOCK_D, PRECISION)
    o = acc / l_i[:, None]
    tl.store(out_ptrs, o.to(out_ptr.dtype.element_ty), mask=io_mask)


def prefill_attention(out: torch.Tensor, q: torch.Tensor, kv_cache: torch.Tensor,
                      block_tables: torch.Tensor, seq_lens: torch.Tensor,
                      query_start_loc: torch.Tensor, scale: float, seq_offset: int,
                      num_seqs: int, max_query_len: int,
                      tiles: PrefillTiles | None = None, tma: bool | None = None) -> None:
    """Causal attention for sequences seq_offset .. seq_offset + num_seqs - 1 of the batch, whose
    K/V (prefix and new tokens) are already in the cache. out, q: [T, H, D], rows addressed by
    query_start_loc. The grid is sized by the host int max_query_len; tiles beyond a sequence's
    own query length exit at once. tma: load K/V tiles through a TMA descriptor (None: wherever
    prefill_tma_supported says the cache allows it); tiles (None: PREFILL_TMA_TILES or
    PREFILL_TILES) and tma are for sweeps and A/Bs."""
    if num_seqs == 0 or max_query_len == 0:
        return
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads, block_size = kv_cache.shape[2], kv_cache.shape[3]
    if tma is None:
        tma = prefill_tma_supported(kv_cache, q.dtype, tiles or PREFILL_TMA_TILES)
    tiles = tiles or (PREFILL_TMA_TILES if tma else PREFILL_TILES)
    shape = prefill_shape(num_heads, num_kv_heads, head_dim, block_size, q.dtype, kv_cache.dtype,
                          tiles, tma)
    num_q_tiles = triton.cdiv(max_query_len, shape.constexprs["BLOCK_Q"])
    if tma:
        rows = kv_cache.view(-1, head_dim)
        kv_desc = TensorDescriptor(rows, list(rows.shape), list(rows.stride()),
                                   [shape.constexprs["BLOCK_N"], head_dim])
        row_strides = [s // head_dim for s in kv_cache.stride()[:3]]
    else:
        kv_desc, row_strides = None, [0, 0, 0]
    _prefill_kernel[(num_q_tiles, num_seqs, num_kv_heads)](
        out, q, kv_cache, kv_desc, block_tables, seq_lens, query_start_loc, scale * LOG2E,
        seq_offset, num_q_tiles, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        block_tables.stride(0), *row_strides, **shape.constexprs,
        num_warps=shape.num_warps, num_stages=shape.num_stages)


def prefill_tma_supported(kv_cache: torch.Tensor, q_dtype: torch.dtype,
                          tiles: PrefillTiles = PREFILL_TMA_TILES) -> bool:
    """Whether the prefill kernel can load its K/V tiles by TMA from this cache: a Hopper or
    later GPU (or the interpreter on a CPU, for the tests), pages of a whole number of key
    tiles, and a contiguous cache whose head_dim is a power of two (one box a tile). On a GPU
    the cache must be in q's dtype: an fp8 cache's boxes agree with its token-by-token loads
    on an H100 but are no faster there (0.98x on the phone agents' chunks, at ~300 TFLOP/s
    against a bf16 cache's ~400: its loads are not what holds it back), so it keeps those."""
    if kv_cache.device.type == "cuda" and (not _has_tma(kv_cache.device)
                                           or kv_cache.dtype != q_dtype):
        return False
    head_dim, block_size = kv_cache.shape[4], kv_cache.shape[3]
    block_n = _prefill_block_n(tiles, q_dtype)
    return (block_size % block_n == 0 and head_dim == next_power_of_2(head_dim) <= 256
            and kv_cache.is_contiguous() and kv_cache.data_ptr() % 16 == 0
            and head_dim * kv_cache.element_size() % 16 == 0)


@functools.cache
def _has_tma(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device)[0] >= 9


def _prefill_block_n(tiles: PrefillTiles, q_dtype: torch.dtype) -> int:
    # fp32 tiles are twice the bytes: halve the key tile to stay within shared memory.
    return tiles.block_n // 2 if q_dtype == torch.float32 else tiles.block_n


@functools.cache
def prefill_shape(num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                  q_dtype: torch.dtype, kv_dtype: torch.dtype,
                  tiles: PrefillTiles = PREFILL_TILES, tma: bool = False) -> KernelShape:
    """The prefill kernel's constexprs, warps and stages for these heads and cache."""
    group = num_heads // num_kv_heads
    block_g = next_power_of_2(group)
    block_d = next_power_of_2(head_dim)
    # Above head_dim 128 the fp32 accumulator of 128 rows would spill: halve the rows.
    block_m = tiles.block_m if block_d <= 128 else tiles.block_m // 2
    block_q = max(1, block_m // block_g)
    block_n = _prefill_block_n(tiles, q_dtype)
    stages = tiles.num_stages or pipeline_stages(
        block_n * block_d * kv_dtype.itemsize,
        resident_bytes=block_q * block_g * block_d * q_dtype.itemsize)
    constexprs = dict(GROUP=group, BLOCK_G=block_g, BLOCK_Q=block_q, HEAD_DIM=head_dim,
                      BLOCK_D=block_d, BLOCK_SIZE=block_size, BLOCK_N=block_n,
                      PRECISION=dot_precision(q_dtype), TMA=tma)
    return KernelShape(constexprs, tiles.num_warps, stages)
