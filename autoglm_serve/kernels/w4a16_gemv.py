"""Decode GEMV for int4 weights with 16-bit activations (W4A16): y = x @ dequant(W)^T (+ bias)
for 1..MAX_ROWS activation rows, and up to WIDE_MAX_ROWS where TUNED has a config for the rows
(there the alternative dequantizes the whole weight for cuBLAS, kernels/wna16_dequant.py, which
reads the packed weight and writes and reads a 16-bit copy of it); the GEMM kernels/wna16.py
runs at prefill.

The weight is our packed layout (quantization/packing.py): int32 words along K, nibble j of a
word is input channel 8w + j, one scale (and optionally a uint8 zero) per group of input
channels. Decode reads each weight byte once per step, so the kernel is bandwidth-bound only if
the unpacking costs few instructions per weight; it is built like kernels/gemv.py (same
GemvConfig, same split-K with the deterministic last-program reduction, PDL, graph-safe
workspaces) with these changes:

- a program loads BLOCK_K / 8 contiguous words of each of its rows (wide loads) and takes the
  8 nibbles of every word in turn, nibble j against x[8w + j]: no reshape of a tile (a
  shared-memory round trip in Triton);
- a nibble becomes a float with no int-to-float conversion (a slow instruction on the SMs):
  moved into a float's mantissa under a fixed exponent it is exactly 2**e + q
  (``_integer_nibble``, one LOP3 and a shift per two nibbles); on CUDA cores the group's scale
  and zero are factored out of each word's sum, s * (sum_j x_j v_j - sum_j 2**e_j x_j -
  z sum_j x_j), the two x sums shared by all the rows a thread holds, so a weight costs its
  LOP3 and one fma (3.7 instructions per weight in the sm_90 SASS at 256 x 128, one row; 6.3
  before, when the zero and scale took an fma per weight and the tile was laid out one row
  per thread);
- CUDA cores (``dot=False``, any rows): products accumulated elementwise in fp32 and reduced
  across K once at the end; ``dot=True`` (2..WIDE_MAX_ROWS rows): one tensor-core product per
  tile of the exact integers q - z in x's dtype (``_integer_weights``, the nibbles interleaved
  back into K order), scaled after it when the tile lies in one group; the sweep picks;
- ``packed=1`` or ``2`` (bf16 activations, CUDA cores): a word's nibbles k and k + 4 become
  one bf16 pair 128 + q with one LOP3, and the pair's products and sums run as bf16x2 fma's
  (``_packed_words_asm``) over 1 or 2 words, whose two lanes are then added in fp32 and
  scaled: fewer instructions and registers a weight in the sm_90 SASS (one row, 128 x 128,
  gated: 3.1 and 2.9 against 3.5; 128 and 124 registers against 163), at one bf16 rounding a
  product and a partial sum;
- the gated variant (gate_up followed by SiLU-and-mul) loads rows n and I + n together.

``TUNED`` is keyed (kind, rows bucket, N, K, group) and filled by scripts/gpu/quant_gemv_bench.py;
None there means the prefill kernel (kernels/wna16.py) was faster, so it runs.
quantization/kernel_checks.py compares the kernel against dequantize-then-matmul at start-up
and sets ``ENABLED = False`` on a problem.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from autoglm_serve.kernels import next_power_of_2, pdl
from autoglm_serve.kernels.gemv import (GemvConfig, as_int32_pairs, as_rows, bf16_lanes,
                                        default_split_k, f16_lanes, finish_split_k, halves,
                                        launch_buffers, rows_bucket, split_k_range)
from autoglm_serve.kernels.pdl import let_dependents_launch, wait_for_previous_grid

ENABLED = True
MAX_ROWS = 16           # the decode CUDA graphs' batch sizes 1, 2, 4, 8, 16
WIDE_MAX_ROWS = 64      # 17..64 rows (decode batches of 32, 48, 64): only where TUNED says
DOT_MIN_ROWS = 16       # tl.dot's smallest tile side for 16-bit operands
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# the exponent bits of 256.0 and 16.0, passed as arguments so they sit in registers: ptxas then
# merges a nibble's and-mask and this or into one LOP3 (two immediates would take two); with a
# nibble in mantissa bits 15..18 (19..22) they make the float 256 + q (16 + q), see
# ``_integer_nibble``
EVEN_EXP = 0x43800000
ODD_EXP = 0x41800000

# (kind, rows bucket, N, K, group) -> config (or None: kernels/wna16.py), from the H200.
# (scripts/gpu/quant_gemv_bench.py, 2026-12-01; one row: scripts/gpu/quant_gemv_depth.py,
# 2026-12-03, and with the scales prefetched a sweep of tiles, warps and stages, 2026-12-04;
# comments: this config, the fallback). The entries marked H100: quant_gemv_bench.py on an
# H100, 2026-12-06; those with a last field of 2 sum two words a bf16 pair
# (``GemvConfig.packed``), which beat the fp32 CUDA-core sums there by 2-10%; those at 4-64
# rows take one tensor-core product a tile (comments: the eight products a tile before it,
# then the path it replaces: at 32 and 64 rows dequantize + cuBLAS, 1.6-2.9x slower).
TUNED: dict[tuple[str, int, int, int, int], GemvConfig | None] = {
    ('gated', 1, 13696, 4096, 128): GemvConfig(64, 128, 4, 4, 2, False, 2),  # H100: 30.9 us (CUDA-core sums 33.9), GEMM kernel 225.7
    ('gated', 2, 13696, 4096, 128): GemvConfig(128, 128, 8, 4, 3, False, 2),  # H100: 35.0 us (one word a sum 37.3), GEMM kernel 214.0
    ('gated', 4, 13696, 4096, 128): GemvConfig(64, 128, 4, 4, 2, True),  # H100: 51.5 us (eight products a tile 72.5), GEMM kernel 214.9
    ('gated', 8, 13696, 4096, 128): GemvConfig(64, 128, 4, 4, 2, True),  # H100: 52.1 us (eight products a tile 75.6), GEMM kernel 211.8
    ('gated', 16, 13696, 4096, 128): GemvConfig(64, 128, 4, 4, 2, True),  # H100: 52.5 us (eight products a tile 95.6), GEMM kernel 224.2
    ('gated', 32, 13696, 4096, 128): GemvConfig(64, 128, 4, 4, 2, True),  # H100: 66.7 us (eight products a tile 149.6), dequantize + cuBLAS 192.2
    ('gated', 64, 13696, 4096, 128): GemvConfig(64, 128, 1, 4, 3, True),  # H100: 79.9 us, dequantize + cuBLAS 194.2
    ('linear', 1, 4096, 13696, 128): GemvConfig(256, 128, 16, 4, 2, False),  # 15.0 us (before the prefetch 17.6), GEMM kernel 114.2
    ('linear', 2, 4096, 13696, 128): GemvConfig(128, 128, 8, 4, 2, False, 2),  # H100: 20.2 us (CUDA-core sums 20.8)
    ('linear', 4, 4096, 13696, 128): GemvConfig(64, 128, 8, 4, 3, True),  # H100: 30.2 us (eight products a tile 40.6), GEMM kernel 108.4
    ('linear', 8, 4096, 13696, 128): GemvConfig(64, 128, 8, 4, 3, True),  # H100: 29.8 us (eight products a tile 44.5), GEMM kernel 107.4
    ('linear', 16, 4096, 13696, 128): GemvConfig(64, 128, 8, 4, 3, True),  # H100: 30.5 us (eight products a tile 53.4), GEMM kernel 110.8
    ('linear', 32, 4096, 13696, 128): GemvConfig(64, 128, 4, 4, 3, True),  # H100: 38.6 us (eight products a tile 102.1), dequantize + cuBLAS 101.2
    ('linear', 64, 4096, 13696, 128): GemvConfig(64, 128, 4, 4, 2, True),  # H100: 43.8 us, dequantize + cuBLAS 101.8
    ('linear', 1, 4608, 4096, 128): GemvConfig(128, 128, 8, 4, 3, False, 2),  # H100: 7.7 us (CUDA-core sums 8.0), GEMM kernel 57.8
    ('linear', 2, 4608, 4096, 128): GemvConfig(128, 128, 8, 4, 2, False, 2),  # H100: 9.2 us (one word a sum 9.4)
    ('linear', 4, 4608, 4096, 128): GemvConfig(64, 128, 8, 4, 2, True),  # H100: 12.4 us (eight products a tile 16.0), GEMM kernel 56.4
    ('linear', 8, 4608, 4096, 128): GemvConfig(64, 128, 8, 4, 3, True),  # H100: 12.5 us (eight products a tile 17.4), GEMM kernel 56.2
    ('linear', 16, 4608, 4096, 128): GemvConfig(64, 128, 8, 4, 2, True),  # H100: 12.9 us (eight products a tile 22.2), GEMM kernel 60.0
    ('linear', 32, 4608, 4096, 128): GemvConfig(64, 128, 4, 4, 3, True),  # H100: 16.2 us (eight products a tile 49.8), dequantize + cuBLAS 31.5
    ('linear', 64, 4608, 4096, 128): GemvConfig(64, 128, 4, 4, 2, True),  # H100: 20.1 us, dequantize + cuBLAS 32.0
    ('linear', 1, 4096, 4096, 128): GemvConfig(128, 128, 16, 4, 2, False),  # 6.6 us (before the prefetch 7.1), GEMM kernel 35.7
    ('linear', 2, 4096, 4096, 128): GemvConfig(128, 128, 8, 4, 2, False),  # H100: 8.5 us (tensor cores 13.1)
    ('linear', 4, 4096, 4096, 128): GemvConfig(64, 128, 8, 4, 2, True),  # H100: 10.8 us (eight products a tile 13.2), GEMM kernel 35.6
    ('linear', 8, 4096, 4096, 128): GemvConfig(64, 128, 8, 4, 2, True),  # H100: 10.9 us (eight products a tile 14.2), GEMM kernel 35.4
    ('linear', 16, 4096, 4096, 128): GemvConfig(64, 128, 8, 4, 2, True),  # H100: 11.3 us (eight products a tile 17.8), GEMM kernel 35.4
    ('linear', 32, 4096, 4096, 128): GemvConfig(64, 128, 4, 4, 3, True),  # H100: 12.2 us (eight products a tile 33.6), dequantize + cuBLAS 25.1
    ('linear', 64, 4096, 4096, 128): GemvConfig(64, 128, 4, 4, 4, True),  # H100: 15.7 us, dequantize + cuBLAS 25.3
}


def default_config(m: int, n: int, k: int, group: int) -> GemvConfig:
    """Untuned: split-K up to ~256 programs. One row on CUDA cores in 128 x 128 tiles: a thread
    holds 4 words of 4 rows and shares its activations' sums across them (4.3 instructions per
    weight in the sm_90 SASS, gated 3.8; 64 x 128 takes 5.5, 256 x 128 3.7 but makes few
    programs). More rows on tensor cores in 128 x 128 tiles (4.4 per weight at 16 and 32 rows;
    64 x 128: 5.0)."""
    block_n, block_k = 128, 128
    split_k = default_split_k(triton.cdiv(n, block_n), triton.cdiv(k, block_k), 4)
    return GemvConfig(block_n, block_k, split_k, num_warps=4, num_stages=3, dot=m > 1)


def _tuned_key(m, n, k, group, gated):
    return ("gated" if gated else "linear", rows_bucket(m), n, k, group)


def select_config(m: int, n: int, k: int, group: int, gated: bool = False) -> GemvConfig:
    return TUNED.get(_tuned_key(m, n, k, group, gated)) or default_config(m, n, k, group)


@triton.jit
def _tile_dot(acc, p, sc, z, x_ptrs, x_mask, HAS_ZEROS: tl.constexpr,
              ONE_GROUP: tl.constexpr, COMPILED: tl.constexpr):
    """acc [BN, BM] += the tensor-core products of one tile: p the packed words [BN, BW], sc and
    z its groups' scales and zeros (``group_params``), x_ptrs [BM, BK] the tile's activations
    in K order. The weights enter the MMA as the exact integers q - z in x's dtype
    (``_integer_weights``), the 8 nibbles of each word interleaved back into K order, so the
    tile is one [BN, BK] x [BK, BM] product; a tile inside one group is scaled once, after it,
    else each weight is scaled first (one rounding, as dequantizing does). (Eight products of
    the nibble planes, [BN, BW] x [BW, BM] each, had cost each tile 8 trips of the weights
    through shared memory, with a barrier and a wait on the wgmma each: 16-32 barriers a tile
    in the sm_90 SASS against 3-5 now.)"""
    dtype: tl.constexpr = x_ptrs.dtype.element_ty
    if not HAS_ZEROS:
        z = 8.0
    if dtype == tl.bfloat16:
        offset: tl.constexpr = 128.0
    elif dtype == tl.float16:
        offset: tl.constexpr = 1024.0
    else:
        offset: tl.constexpr = 8388608.0
    zero = z + offset
    tile = tl.zeros_like(acc)
    n0 = _nibble_weights(p, 0, zero, sc, dtype, ONE_GROUP, COMPILED)
    n1 = _nibble_weights(p, 1, zero, sc, dtype, ONE_GROUP, COMPILED)
    n2 = _nibble_weights(p, 2, zero, sc, dtype, ONE_GROUP, COMPILED)
    n3 = _nibble_weights(p, 3, zero, sc, dtype, ONE_GROUP, COMPILED)
    n4 = _nibble_weights(p, 4, zero, sc, dtype, ONE_GROUP, COMPILED)
    n5 = _nibble_weights(p, 5, zero, sc, dtype, ONE_GROUP, COMPILED)
    n6 = _nibble_weights(p, 6, zero, sc, dtype, ONE_GROUP, COMPILED)
    n7 = _nibble_weights(p, 7, zero, sc, dtype, ONE_GROUP, COMPILED)
    # each join adds a minor axis: the innermost pairs nibbles 4 apart, the outermost adjacent
    # ones, so the [BN, BW, 2, 2, 2] tile read in order is nibble j of word w at 8w + j
    w = tl.join(tl.join(tl.join(n0, n4), tl.join(n2, n6)),
                tl.join(tl.join(n1, n5), tl.join(n3, n7)))
    w = tl.reshape(w, (w.shape[0], w.shape[1] * 8))
    x = tl.load(x_ptrs, mask=x_mask, other=0.0)
    tile = tl.dot(w, tl.trans(x), tile, input_precision="ieee")
    if ONE_GROUP:
        return tl.fma(tile, sc, acc)
    return acc + tile


@triton.jit
def _nibble_weights(p, J: tl.constexpr, zero, sc, dtype: tl.constexpr, ONE_GROUP: tl.constexpr,
                    COMPILED: tl.constexpr):
    """Nibble J of each word as the MMA's weight in x's dtype: q - z, or (q - z) * scale
    where the tile spans several groups."""
    w = _integer_weights(p, J, dtype)
    if ONE_GROUP and COMPILED:     # small integers: exact in x's dtype (packed HADD2)
        w = w - zero.to(dtype)
    else:   # one rounding of the scaled weight; the interpreter's bf16 is raw integers
        w = w.to(tl.float32) - zero
        if not ONE_GROUP:
            w = w * sc
        w = w.to(dtype)
    return w


@triton.jit
def _integer_weights(p, J: tl.constexpr, dtype: tl.constexpr):
    """Nibble J of each packed word as offset + q exactly in ``dtype`` (bf16: 128 + q, fp16:
    1024 + q, fp32: 2**23 + q): the nibble in the low mantissa bits under the offset's
    exponent, no int-to-float conversion."""
    q = (p >> (4 * J)) & 0xF
    if dtype == tl.bfloat16:
        v = (q | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True)
    elif dtype == tl.float16:
        v = (q | 0x6400).to(tl.int16).to(tl.float16, bitcast=True)
    else:
        v = (q | 0x4B000000).to(tl.float32, bitcast=True)
    return v


@triton.jit
def _integer_nibble(p, even_exp, odd_exp, J: tl.constexpr):
    """Nibble J of each packed word as the float 2**e + q, exactly (e = 8 for even J, 4 for
    odd): the nibble moved to mantissa bits 15..18 or 19..22 (one shift serves two nibbles)
    under the exponent of 2**e, one and-or (LOP3; the exponents are arguments, in registers)."""
    if J < 2:
        moved = p << 15
    elif J < 4:
        moved = p << 7
    elif J < 6:
        moved = p >> 1
    else:
        moved = p >> 9
    if J % 2 == 0:
        return ((moved & 0x78000) | even_exp).to(tl.float32, bitcast=True)
    return ((moved & 0x780000) | odd_exp).to(tl.float32, bitcast=True)


@triton.jit
def _x_values(x_ptrs, x_mask, X_PAIRS: tl.constexpr):
    """The 8 activations of each word as fp32 [BM, BW] tensors, and two sums the products need:
    offset = sum_j 2**e_j x_j (e_j of ``_integer_nibble``) and total = sum_j x_j. X_PAIRS: x
    is 16-bit, read as int32 pairs (4 loads a word; bf16 to fp32 is a shift, fp16 a cvt)."""
    if X_PAIRS:
        x0, x1 = _x_pair(x_ptrs, x_mask, 0, X_PAIRS)
        x2, x3 = _x_pair(x_ptrs, x_mask, 1, X_PAIRS)
        x4, x5 = _x_pair(x_ptrs, x_mask, 2, X_PAIRS)
        x6, x7 = _x_pair(x_ptrs, x_mask, 3, X_PAIRS)
    else:
        x0 = tl.load(x_ptrs, mask=x_mask, other=0.0)
        x1 = tl.load(x_ptrs + 1, mask=x_mask, other=0.0)
        x2 = tl.load(x_ptrs + 2, mask=x_mask, other=0.0)
        x3 = tl.load(x_ptrs + 3, mask=x_mask, other=0.0)
        x4 = tl.load(x_ptrs + 4, mask=x_mask, other=0.0)
        x5 = tl.load(x_ptrs + 5, mask=x_mask, other=0.0)
        x6 = tl.load(x_ptrs + 6, mask=x_mask, other=0.0)
        x7 = tl.load(x_ptrs + 7, mask=x_mask, other=0.0)
    even = (x0 + x2) + (x4 + x6)
    odd = (x1 + x3) + (x5 + x7)
    return x0, x1, x2, x3, x4, x5, x6, x7, tl.fma(even, 256.0, odd * 16.0), even + odd


@triton.jit
def _x_pair(x_ptrs, x_mask, I: tl.constexpr, X_PAIRS: tl.constexpr):
    """Activations 2I and 2I + 1 of each word from one int32 load (X_PAIRS 1: bf16, 2: fp16)."""
    xu = tl.load(x_ptrs + I, mask=x_mask, other=0).to(tl.uint32, bitcast=True)
    if X_PAIRS == 1:
        lo, hi = bf16_lanes(xu)
    else:
        lo, hi = f16_lanes(xu)
    return lo, hi


@triton.jit
def _load_unpinned(ptrs, COMPILED: tl.constexpr):
    """tl.load(ptrs) as fp32 (8-bit: unsigned), as inline PTX when COMPILED. A tl.load is an
    anchor of Triton's layout pass: the per-row scale and zero loads ([BLOCK_N, 1, 1], one
    thread per row) then pinned the whole tile to one row per thread and converted the nibbles
    through shared memory, where an elementwise asm takes the tile's layout (4 words of
    BLOCK_N / 32 rows per thread): 5.8 -> 3.6 instructions per weight at 256 x 128 in the
    sm_90 SASS. COMPILED: not the interpreter, which runs no PTX (tl.load there)."""
    BITS: tl.constexpr = ptrs.dtype.element_ty.primitive_bitwidth
    if not COMPILED:
        v = tl.load(ptrs).to(tl.float32)
    elif BITS == 8:
        v = tl.inline_asm_elementwise("ld.global.nc.u8 $0, [$1];", "=r,l", [ptrs],
                                      dtype=tl.int32, is_pure=True, pack=1).to(tl.float32)
    elif BITS == 16:
        v = tl.inline_asm_elementwise("ld.global.nc.b16 $0, [$1];", "=h,l", [ptrs],
                                      dtype=ptrs.dtype.element_ty, is_pure=True,
                                      pack=1).to(tl.float32)
    else:
        v = tl.inline_asm_elementwise("ld.global.nc.b32 $0, [$1];", "=r,l", [ptrs],
                                      dtype=ptrs.dtype.element_ty, is_pure=True,
                                      pack=1).to(tl.float32)
    return v


@triton.jit
def _tile_cuda_cores(acc, p, sc, z, xs, even_exp, odd_exp, HAS_ZEROS: tl.constexpr):
    """acc [BN, BM, BW] += the products of one tile on CUDA cores, p the packed words
    [BN, 1, BW], sc and z its groups' scales and zeros (``group_params``), xs ``_x_values``
    ([BM, BW] each). The group's scale and zero are factored out of each word's sum: with
    v_j = 2**e_j + q_j (``_integer_nibble``), sum_j x_j (q_j - z) s = s (sum_j x_j v_j -
    offset - z total), so a weight costs its LOP3 and one fma (plus a shift per two), the
    scale and zero two fmas per word."""
    x0, x1, x2, x3, x4, x5, x6, x7, offset, total = xs
    if HAS_ZEROS:
        t = tl.fma(-z, total[None, :, :], -offset[None, :, :])
    else:          # symmetric: the zero 8 is x's alone
        t = tl.zeros_like(acc) - tl.fma(total, 8.0, offset)[None, :, :]
    t = tl.fma(_integer_nibble(p, even_exp, odd_exp, 0), x0[None, :, :], t)
    t = tl.fma(_integer_nibble(p, even_exp, odd_exp, 1), x1[None, :, :], t)
    t = tl.fma(_integer_nibble(p, even_exp, odd_exp, 2), x2[None, :, :], t)
    t = tl.fma(_integer_nibble(p, even_exp, odd_exp, 3), x3[None, :, :], t)
    t = tl.fma(_integer_nibble(p, even_exp, odd_exp, 4), x4[None, :, :], t)
    t = tl.fma(_integer_nibble(p, even_exp, odd_exp, 5), x5[None, :, :], t)
    t = tl.fma(_integer_nibble(p, even_exp, odd_exp, 6), x6[None, :, :], t)
    t = tl.fma(_integer_nibble(p, even_exp, odd_exp, 7), x7[None, :, :], t)
    return tl.fma(t, sc, acc)


def _packed_words_asm(words: int) -> str:
    """PTX (sm_80+) for ``words`` packed words of a row against their 8 bf16 activations each,
    in bf16 pairs: pair k of a word is nibbles k and k + 4 (one shift, one LOP3 into 128 + q,
    exact), less 128 + z (an fma by one: exact small integers), times activations k and k + 4,
    summed in the pair's two lanes across all the words. $1..$words the words, then 4 activation
    pairs a word, then -(128 + z) in both lanes; $0 the two lanes' sums."""
    nz = f"${words + 4 * words + 1}"
    lines = [".reg .b32 t, w, acc, one, nzero;", "mov.b32 one, 0x3F803F80;",
             "mov.b32 nzero, 0x80008000;"]
    for word in range(words):
        for k in range(4):
            src = f"${word + 1}"
            if k:
                lines.append(f"shr.u32 t, {src}, {4 * k};")
                src = "t"
            x = f"${words + 4 * word + k + 1}"
            last = word == words - 1 and k == 3
            lines += [f"lop3.b32 w, {src}, 0x000F000F, 0x43004300, 0xEA;",
                      f"fma.rn.bf16x2 w, w, one, {nz};",
                      f"fma.rn.bf16x2 {'$0' if last else 'acc'}, w, {x}, "
                      f"{'nzero' if word == 0 and k == 0 else 'acc'};"]
    return "{\n" + "\n".join(lines) + "\n}"


_ONE_WORD_ASM = tl.constexpr(_packed_words_asm(1))
_TWO_WORDS_ASM = tl.constexpr(_packed_words_asm(2))


@triton.jit
def _x_packed_pairs(x_ptrs, x_mask):
    """The 8 bf16 activations of each word, read as 4 int32 pairs (x0, x1) .. (x6, x7), as the
    pairs (x_k, x_k+4), k = 0..3, that ``_packed_sums`` multiplies (uint32 [BM, BW])."""
    x01 = tl.load(x_ptrs, mask=x_mask, other=0).to(tl.uint32, bitcast=True)
    x23 = tl.load(x_ptrs + 1, mask=x_mask, other=0).to(tl.uint32, bitcast=True)
    x45 = tl.load(x_ptrs + 2, mask=x_mask, other=0).to(tl.uint32, bitcast=True)
    x67 = tl.load(x_ptrs + 3, mask=x_mask, other=0).to(tl.uint32, bitcast=True)
    high = 0xFFFF0000
    return ((x01 & 0xFFFF) | (x45 << 16), (x01 >> 16) | (x45 & high),
            (x23 & 0xFFFF) | (x67 << 16), (x23 >> 16) | (x67 & high))


@triton.jit
def _pair_sum(pw, x_pair, nz, K: tl.constexpr):
    """(q_k - z) x_k + (q_k+4 - z) x_k+4 in fp32 (the interpreter's ``_packed_sums``)."""
    x_lo, x_hi = bf16_lanes(x_pair)
    q_lo = ((pw >> (4 * K)) & 0xF).to(tl.float32)
    q_hi = ((pw >> (4 * K + 16)) & 0xF).to(tl.float32)
    return (q_lo + 128.0 + nz) * x_lo + (q_hi + 128.0 + nz) * x_hi


@triton.jit
def _word_sums_fp32(pw, xa, xb, xc, xd, nz2):
    """sum_j (q_j - z) x_j of each word in fp32: the interpreter, which runs no PTX."""
    nz, _ = bf16_lanes(nz2)            # -(128 + z)
    return (_pair_sum(pw, xa, nz, 0) + _pair_sum(pw, xb, nz, 1) + _pair_sum(pw, xc, nz, 2)
            + _pair_sum(pw, xd, nz, 3))


@triton.jit
def _packed_sums(p, xp, nz2, WORDS: tl.constexpr, COMPILED: tl.constexpr):
    """sum_j (q_j - z) x_j over WORDS adjacent words, fp32 [BN, BM, BW / WORDS]: on the GPU in
    bf16 pairs (``_packed_words_asm``: each product and partial sum rounded to bf16, the two
    lanes then added in fp32); in the interpreter the same sum in fp32. p the words [BN, 1, BW],
    xp their ``_x_packed_pairs`` [1, BM, BW], nz2 -(128 + z) in both lanes."""
    pw = p.to(tl.uint32, bitcast=True)
    xa, xb, xc, xd = xp
    if WORDS == 1:
        if COMPILED:
            sums = tl.inline_asm_elementwise(_ONE_WORD_ASM, "=r,r,r,r,r,r,r",
                                             [pw, xa, xb, xc, xd, nz2], dtype=tl.uint32,
                                             is_pure=True, pack=1)
        else:
            return _word_sums_fp32(pw, xa, xb, xc, xd, nz2)
    else:       # two adjacent words of a row share one sum (they share a group)
        p0, p1 = halves(pw)
        a0, a1 = halves(xa)
        b0, b1 = halves(xb)
        c0, c1 = halves(xc)
        d0, d1 = halves(xd)
        if COMPILED:
            sums = tl.inline_asm_elementwise(_TWO_WORDS_ASM, "=r,r,r,r,r,r,r,r,r,r,r,r",
                                             [p0, p1, a0, b0, c0, d0, a1, b1, c1, d1, nz2],
                                             dtype=tl.uint32, is_pure=True, pack=1)
        else:
            return (_word_sums_fp32(p0, a0, b0, c0, d0, nz2)
                    + _word_sums_fp32(p1, a1, b1, c1, d1, nz2))
    lo, hi = bf16_lanes(sums)
    return lo + hi


@triton.jit
def _tile_packed(acc, p, sc, z, xp, HAS_ZEROS: tl.constexpr, WORDS: tl.constexpr,
                 COMPILED: tl.constexpr):
    """acc [BN, BM, BW / WORDS] += the products of one tile in bf16 pairs (bf16 activations,
    CUDA cores): the sums of WORDS words at a time (``_packed_sums``) times their group's
    scale. p the packed words [BN, 1, BW], sc and z the groups' scales and zeros
    (``group_params``: one a row, or one a word with WORDS 1), xp ``_x_packed_pairs``."""
    if WORDS == 2 and sc.shape[2] > 1:     # a scale (and zero) a word: one per two words
        sc = halves(sc)[0]
        z = halves(z)[0]
    if HAS_ZEROS:      # -(128 + z), exact in bf16, in both lanes
        nz = (-(z + 128.0)).to(tl.bfloat16).to(tl.uint16, bitcast=True).to(tl.uint32)
        nz2 = nz | (nz << 16)
    else:              # symmetric: z = 8, bf16(-136) in both lanes
        nz2 = tl.full(sc.shape, 0xC308C308, tl.uint32)
    sums = _packed_sums(p, (xp[0][None, :, :], xp[1][None, :, :], xp[2][None, :, :],
                            xp[3][None, :, :]), nz2, WORDS, COMPILED)
    return tl.fma(sums, sc, acc)


@triton.jit
def _group_offsets(r, wo, k, groups, GROUP: tl.constexpr, ONE_GROUP: tl.constexpr):
    """Offsets into scales and zeros of the groups the tile at K offset k lies in: one per row
    when ONE_GROUP, else one per word (clamped: masked words past K would name a group past
    the last)."""
    if ONE_GROUP:
        g = r * groups + k // GROUP
    else:
        g = r * groups + tl.minimum((k + wo * 8) // GROUP, groups - 1)
    return g


@triton.jit
def group_params(s_ptrs, z_ptrs, HAS_ZEROS: tl.constexpr, COMPILED: tl.constexpr):
    """A tile's scales and zeros as fp32 (no zeros: the scales again, unused). Shared by the
    8-bit GEMV (kernels/w8a16_gemv.py)."""
    sc = _load_unpinned(s_ptrs, COMPILED)
    z = sc
    if HAS_ZEROS:
        z = _load_unpinned(z_ptrs, COMPILED)
    return sc, z


@triton.jit
def _w4a16_gemv_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, bias_ptr, y_ptr, partial_ptr, count_ptr,
                       M, N, K, x_stride, words, groups, even_exp, odd_exp,
                       GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, X_PAIRS: tl.constexpr,
                       HAS_BIAS: tl.constexpr, GATED: tl.constexpr, USE_DOT: tl.constexpr,
                       PACKED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
                       NUM_STAGES: tl.constexpr, COMPILED: tl.constexpr, PDL: tl.constexpr):
    """y[m, n] = sum_k x[m, k] dequant(w)[n, k]; program (i, s) owns BLOCK_N features and the
    s-th of SPLIT_K runs of K chunks. GATED: 2N weight rows and
    y = silu(x @ w[:N]^T) * (x @ w[N:]^T).

    Tiles are BLOCK_K / 8 packed words of each row; nibble j of word w meets x[:, 8w + j]. On
    CUDA cores everything is 3-D, [BLOCK_N, BLOCK_M, BLOCK_K / 8], loaded in that shape so the
    broadcasts need no layout conversion, and the K axis is reduced once after the loop; with
    tl.dot, one [BLOCK_N, BLOCK_K] x [BLOCK_K, BLOCK_M] product per tile."""
    BW: tl.constexpr = BLOCK_K // 8
    ONE_GROUP: tl.constexpr = GROUP % BLOCK_K == 0
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(offs_n, N - 1).to(tl.int64)   # rows past N re-read row N - 1, dropped
    offs_m = tl.arange(0, BLOCK_M)
    offs_w = tl.arange(0, BW)
    # words (K / 8) and groups (K / GROUP) are arguments, not computed here, so Triton sees the
    # packed row stride's divisibility by 16 and issues 16-byte weight loads
    if USE_DOT:
        r = rows[:, None]
        wo = offs_w[None, :]
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        r = rows[:, None, None]
        wo = offs_w[None, None, :]
        # (in bf16 pairs, PACKED words share an accumulator)
        acc = tl.zeros((BLOCK_N, BLOCK_M, BW // PACKED if PACKED else BW), dtype=tl.float32)
    acc_up = tl.zeros_like(acc)
    q_gate = qw_ptr + r * words + wo
    q_up = qw_ptr + (r + N) * words + wo
    m_mask = offs_m[:, None] < M
    if USE_DOT:      # x [BLOCK_M, BLOCK_K] in K order
        offs_k = tl.arange(0, BLOCK_K)
        x_base = x_ptr + offs_m[:, None] * x_stride + offs_k[None, :]
    else:
        # x[m, 8w] as [BLOCK_M, BW]: loaded once per thread and word, whatever the number of
        # rows a thread holds (broadcast as [None, :, :]). X_PAIRS: x is int32 pairs
        x_base = x_ptr + offs_m[:, None] * x_stride + (offs_w * (4 if X_PAIRS else 8))[None, :]

    k_start, k_end = split_k_range(pid_k, K, BLOCK_K, SPLIT_K)
    # Scales and zeros are loaded a tile ahead of their use: in the loop body their load
    # latency stalled every tile (the weights and x are pipelined by Triton, these loads are
    # inline PTX, see _load_unpinned). They are weights, which no kernel writes, so the first
    # tile's load goes before the wait for the previous kernel.
    up = N * groups
    # (a program past K's last chunk runs no tile: it must not read past the last group)
    g = _group_offsets(r, wo, tl.minimum(k_start, k_end - 1), groups, GROUP, ONE_GROUP)
    sc, z = group_params(s_ptr + g, z_ptr + g, HAS_ZEROS, COMPILED)
    sc_up, z_up = sc, z
    if GATED:
        sc_up, z_up = group_params(s_ptr + up + g, z_ptr + up + g, HAS_ZEROS, COMPILED)
    wait_for_previous_grid(PDL)
    for k in tl.range(k_start, k_end, BLOCK_K, num_stages=NUM_STAGES):
        # the last tile loads its own groups again (in bounds, unused)
        g = _group_offsets(r, wo, tl.minimum(k + BLOCK_K, k_end - 1), groups, GROUP,
                           ONE_GROUP)
        sc_next, z_next = group_params(s_ptr + g, z_ptr + g, HAS_ZEROS, COMPILED)
        sc_up_next, z_up_next = sc_next, z_next
        if GATED:
            sc_up_next, z_up_next = group_params(s_ptr + up + g, z_ptr + up + g, HAS_ZEROS,
                                                  COMPILED)
        w_mask = wo < words - k // 8
        if EVEN_K:       # no masks on the weights: 16-byte loads
            x_mask = m_mask
            p = tl.load(q_gate + k // 8)
        else:
            if USE_DOT:
                x_mask = m_mask & (offs_k < K - k)[None, :]
            else:
                x_mask = m_mask & (offs_w < words - k // 8)[None, :]
            p = tl.load(q_gate + k // 8, mask=w_mask, other=0)
        x_tile = x_base + (k // 2 if X_PAIRS else k)
        if USE_DOT:
            acc = _tile_dot(acc, p, sc, z, x_tile, x_mask, HAS_ZEROS, ONE_GROUP, COMPILED)
        elif PACKED:
            xs = _x_packed_pairs(x_tile, x_mask)
            acc = _tile_packed(acc, p, sc, z, xs, HAS_ZEROS, PACKED, COMPILED)
        else:
            xs = _x_values(x_tile, x_mask, X_PAIRS)
            acc = _tile_cuda_cores(acc, p, sc, z, xs, even_exp, odd_exp, HAS_ZEROS)
        if GATED:
            if EVEN_K:
                p2 = tl.load(q_up + k // 8)
            else:
                p2 = tl.load(q_up + k // 8, mask=w_mask, other=0)
            if USE_DOT:
                acc_up = _tile_dot(acc_up, p2, sc_up, z_up, x_tile, x_mask, HAS_ZEROS,
                                   ONE_GROUP, COMPILED)
            elif PACKED:
                acc_up = _tile_packed(acc_up, p2, sc_up, z_up, xs, HAS_ZEROS, PACKED,
                                      COMPILED)
            else:
                acc_up = _tile_cuda_cores(acc_up, p2, sc_up, z_up, xs, even_exp, odd_exp,
                                          HAS_ZEROS)
        sc, z, sc_up, z_up = sc_next, z_next, sc_up_next, z_up_next
    if not USE_DOT:     # the tensor-core path signals at exit (kernels/pdl.py says why)
        let_dependents_launch(PDL)
    if USE_DOT:
        out = acc
        out_up = acc_up
    else:   # one cross-K reduction for the whole loop
        out = tl.sum(acc, axis=2)
        out_up = tl.sum(acc_up, axis=2)
    finish_split_k(y_ptr, bias_ptr, partial_ptr, count_ptr, out, out_up, rows, offs_m, offs_n,
                   pid_n, pid_k, M, N, HAS_BIAS, GATED, SPLIT_K)


def supports(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bits: int,
             group: int, bias: torch.Tensor | None = None, gated: bool = False) -> bool:
    """Whether the GEMV handles this call and is not slower than kernels/wna16.py where
    measured."""
    if not ENABLED or bits != 4 or x.dtype not in DTYPES or not x.is_cuda:
        return False
    k = x.shape[-1]
    if k == 0 or qweight.shape[1] * 8 != k or k % group or group % 8:
        return False
    if not (qweight.is_contiguous() and scales.is_contiguous()):
        return False
    m = x.numel() // k
    if not 1 <= m <= WIDE_MAX_ROWS:
        return False
    n = qweight.shape[0] // 2 if gated else qweight.shape[0]
    if gated and (qweight.shape[0] % 2 or bias is not None):
        return False
    key = _tuned_key(m, n, k, group, gated)
    if m > MAX_ROWS:     # measured against dequantize-then-cuBLAS, or not taken
        return TUNED.get(key) is not None
    return key not in TUNED or TUNED[key] is not None


def _launch(x, qweight, scales, zeros, group, bias, n, gated, config):
    k = x.shape[-1]
    x2 = as_rows(x, k, WIDE_MAX_ROWS)
    m = x2.shape[0]
    cfg = config or select_config(m, n, k, group, gated)
    assert cfg.block_k % 8 == 0 and cfg.block_k >= 16
    assert not cfg.dot or (cfg.block_k >= 128 and cfg.block_n >= 16), "tl.dot tiles are >= 16"
    # split-K partials for the rows bucket (gate_up at 64 rows, split 8: 56 MB)
    y, tiles, partials, counts = launch_buffers(x, m, n, cfg, gated,
                                                max(MAX_ROWS, rows_bucket(m)))
    block_m = max(DOT_MIN_ROWS, next_power_of_2(m)) if cfg.dot \
        else next_power_of_2(m)
    # CUDA cores read 16-bit activations as int32 pairs (X_PAIRS 1: bf16, 2: fp16); bf16 ones
    # multiply in pairs with cfg.packed (words a bf16 sum)
    pairs = 0 if cfg.dot or x.dtype == torch.float32 else (1 if x.dtype == torch.bfloat16 else 2)
    packed = int(cfg.packed) if pairs == 1 else 0
    assert packed in (0, 1, 2) and (packed < 2 or group % 16 == 0 and cfg.block_k >= 32)
    _w4a16_gemv_kernel[(tiles, cfg.split_k)](
        as_int32_pairs(x2) if pairs else x2, qweight, scales,
        zeros if zeros is not None else scales, bias if bias is not None else scales, y,
        partials, counts, m, n, k, k // 2 if pairs else k, k // 8, k // group, EVEN_EXP,
        ODD_EXP,
        GROUP=group, HAS_ZEROS=zeros is not None, X_PAIRS=pairs, HAS_BIAS=bias is not None,
        GATED=gated, USE_DOT=cfg.dot, PACKED=packed, BLOCK_M=block_m, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k, EVEN_K=k % cfg.block_k == 0,
        NUM_STAGES=cfg.num_stages, COMPILED=os.environ.get("TRITON_INTERPRET") != "1",
        num_warps=cfg.num_warps, **pdl.launch_options(x.device))
    return y.view(*x.shape[:-1], n)


def w4a16_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
               zeros: torch.Tensor | None, group: int, bias: torch.Tensor | None = None,
               config: GemvConfig | None = None) -> torch.Tensor:
    """x [..., K] (<= WIDE_MAX_ROWS rows), qweight int32 [N, K / 8], scales [N, K / group],
    zeros uint8 [N, K / group] or None (symmetric: 8) -> [..., N] in x's dtype."""
    return _launch(x, qweight, scales, zeros, group, bias, qweight.shape[0], False, config)


def w4a16_gated_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                     zeros: torch.Tensor | None, group: int,
                     config: GemvConfig | None = None) -> torch.Tensor:
    """silu(x @ gate^T) * (x @ up^T) for a packed [gate; up] weight of 2I rows -> [..., I]."""
    assert qweight.shape[0] % 2 == 0
    return _launch(x, qweight, scales, zeros, group, None, qweight.shape[0] // 2, True, config)
