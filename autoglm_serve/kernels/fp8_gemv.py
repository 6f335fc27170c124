"""Decode GEMV for FP8 W8A8: e4m3 weights with one fp32 scale per output channel, activations
quantized per token inside the kernel, for 1..MAX_ROWS rows where TUNED keeps it (elsewhere the
activations come quantized, from the norm before the layer or a kernel of their own, and
quantization/fp8.py multiplies them with kernels/fp8_gemm.py's split-K GEMM or
``torch._scaled_mm``, whose numerics this kernel keeps).

At M = 1 the ``_scaled_mm`` path is 4 torch ops for the activation's scale and cast plus a GEMM
tuned for large M: slower than the bf16 GEMV despite half the bytes. Here, as kernels/gemv.py
(same GemvConfig, split-K with the deterministic last-program reduction, PDL, graph-safe
workspaces):

- each program first computes the amax of its activation rows over all of K (x is a few KB and
  sits in L2), so the per-token scale needs no other kernel; where the kernel that wrote x
  computed the amax on the way (GLM's fused norm pair before qkv and gate_up: ``row_amax``),
  it is loaded instead: gate_up 40.4 -> 31.5 us and qkv 10.4 -> 9.2 at one row on the H200
  (scripts/gpu/quant_gemv_depth.py, BENCHMARKS.md);
- in the K loop the activation tile is quantized the same way (x / scale, saturated, rounded
  to e4m3); the products of two e4m3 values are exact in fp32, so the sum is the W8A8
  product ``_scaled_mm`` computes, up to summation order: on CUDA cores (one row) the weight
  tile is converted in registers; with ``dot=True`` both e4m3 tiles go to the tensor cores as
  they are (Hopper's FP8 wgmma, ~1-2 instructions per weight in the sm_90 SASS where
  converting the weights to bf16 first took 4.2; tiles of >= 64 rows, fewer fall back to the
  converting MMA). That MMA sums a chunk in an accumulator of fewer bits than fp32's, so each
  BLOCK_K chunk is added to the fp32 accumulator on its own (``max_num_imprecise_acc``);
- ``packed`` (1, 2 or 4 words; one row on CUDA cores): the weight is read as int32 words of 4
  e4m3 values, each half word becomes an f16 pair with one cvt, and the activations are
  quantized a pair at a time into f16 pairs (times PAIR_SCALE, exact); the products and their
  sum over the words run in fma.rn.f16x2, whose two lanes are then added in fp32. A product of
  two e4m3 values is exact in f16, each partial sum rounds to 11 bits (as ``_scaled_mm``'s
  fast accumulation in prompts rounds its chunks): in the sm_90 SASS 2.2-2.9 instructions a
  weight against 4.0-4.5 (fp32 FMAs after two conversions a weight), 56-88 registers against
  96-106 (scripts/quant_gemv_sass.py). On an H100, where these GEMVs stream 2.0-2.8 TB/s, that
  took gate_up (with its own amax pass) from 42.9+ to 40.2 us, qkv from 9.7+ to 9.2, down and
  o_proj not at all, and the engine's single stream nowhere (243.2 against 243.7 tok/s,
  BENCHMARKS.md), so TUNED takes none yet; the H200's extra bandwidth leaves the
  SMs less time a weight, where it may;
- the fp32 result is scaled by x_scale * w_scale[n] before the split-K reduction (linear, so the
  partials may be scaled each), then bias or SiLU gating as in the bf16 GEMV.

``TUNED`` is keyed (kind, rows bucket, N, K), filled by scripts/gpu/quant_gemv_bench.py; None
there means the activations' quantization and a GEMM were faster (kernels/fp8_gemm.py's split-K
GEMM, or ``_scaled_mm``). quantization/kernel_checks.py compares the kernel against
the W8A8 reference at start-up and sets ``ENABLED = False`` on a problem.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from autoglm_serve.kernels import next_power_of_2, pdl
from autoglm_serve.kernels.fp8_rows import FP8_MAX, row_scale
from autoglm_serve.kernels.gemv import (GemvConfig, as_int32_pairs, as_rows, bf16_lanes,
                                        default_split_k, f16_lanes, finish_split_k, halves,
                                        launch_buffers, load_k_tile, reduce_accumulators,
                                        row_tiles, rows_bucket, split_k_range,
                                        zero_accumulators)
from autoglm_serve.kernels.pdl import let_dependents_launch, wait_for_previous_grid

ENABLED = True
MAX_ROWS = 8
# packed configs: the activations enter the f16 pairs times 2**-5 (exact), so that a lane's sum
# of up to 8 e4m3 products (4 words) stays within f16's 65,504: 8 * 448 * 448 / 32 = 50,176
PAIR_SCALE = tl.constexpr(2.0 ** -5)
PACKED_WORDS = (1, 2, 4)
DOT_MIN_ROWS = 16
DTYPES = (torch.bfloat16, torch.float16)

# (kind, rows bucket, N, K) -> config, or None: the activations quantized (by the norm pair
# before qkv and gate_up from two rows since fec97e0, else by a kernel of their own), then
# kernels/fp8_gemm.py's split-K GEMM where it has the shape, else _scaled_mm. One row: from the
# H200 (scripts/gpu/quant_gemv_bench.py, 2026-12-01; comments: this config, _scaled_mm). 2-8
# rows: the quantization and the split-K GEMM won on an H100 (scripts/gpu/fp8_gemm_sweep.py
# --ms 8,2,1,4, 2026-12-05, before fec97e0: every "quantize" below ran as a kernel then; us,
# with gate_up's SiLU-and-mul quantization, which also quantizes down's input); one row there:
# GEMV qkv 11.7, o_proj 8.7, gate_up + down 72.2 against 12.6, 10.9 and 72.9, so the GEMV
# stays. scripts/gpu/fp8_gemm_sweep.py's gemv_decisions prints these verdicts.
TUNED: dict[tuple[str, int, int, int], GemvConfig | None] = {
    ('gated', 1, 13696, 4096): GemvConfig(8, 512, 1, 4, 3, False),  # 40.6 us, _scaled_mm 51.8
    ('gated', 2, 13696, 4096): None,  # GEMV 57.1; quantize 2.2 + GEMM 40.2 + SiLU quantize 7.6
    ('gated', 4, 13696, 4096): None,  # GEMV 48.1; quantize 2.2 + GEMM 40.3 + SiLU quantize 7.6
    ('gated', 8, 13696, 4096): None,  # GEMV 48.7; quantize 2.3 + GEMM 40.2 + SiLU quantize 7.6
    # gate_up as a plain linear, where the gated GEMV above is declined: an untuned shape here
    # would take the GEMV's default tiles (8 rows: 57.5 us in the H100 engine's decode graph)
    ('linear', 2, 27392, 4096): None,  # GEMM 40.2 (its input quantized by the norm before)
    ('linear', 4, 27392, 4096): None,  # GEMM 40.3
    ('linear', 8, 27392, 4096): None,  # GEMM 40.2
    ('linear', 1, 4096, 13696): GemvConfig(8, 1024, 1, 4, 3, False),  # 21.9 us, _scaled_mm 51.4
    ('linear', 2, 4096, 13696): None,  # GEMV 41.9; quantize 7.6 + GEMM 22.8
    ('linear', 4, 4096, 13696): None,  # GEMV 42.4; quantize 7.6 + GEMM 22.9
    ('linear', 8, 4096, 13696): None,  # GEMV 43.1; quantize 7.7 + GEMM 23.1
    ('linear', 1, 4608, 4096): GemvConfig(8, 512, 1, 4, 3, False),  # 10.3 us, _scaled_mm 19.6
    ('linear', 2, 4608, 4096): None,  # GEMV 15.1; quantize 2.2 + GEMM 9.8
    ('linear', 4, 4608, 4096): None,  # GEMV 15.9; quantize 2.2 + GEMM 9.5
    ('linear', 8, 4608, 4096): None,  # GEMV 16.3; quantize 2.3 + GEMM 9.6
    ('linear', 1, 4096, 4096): GemvConfig(8, 1024, 1, 4, 3, False),  # 8.2 us, _scaled_mm 16.9
    ('linear', 2, 4096, 4096): None,  # GEMV 13.8; quantize 2.2 + GEMM 8.8
    ('linear', 4, 4096, 4096): None,  # GEMV 14.3; quantize 2.2 + GEMM 8.5
    ('linear', 8, 4096, 4096): None,  # GEMV 14.5; quantize 2.3 + GEMM 8.6
}


def default_config(m: int, n: int, k: int) -> GemvConfig:
    """Untuned: split-K up to ~256 programs; one row on CUDA cores in 16 x 512 tiles (3.8
    instructions per weight in the sm_90 SASS, 8 x 512: 4.9), more rows in 128 x 256 e4m3
    tensor-core tiles (1.3, the activations' quantization most of it; 128 x 128: 1.6)."""
    block_n, block_k = (16, 512) if m == 1 else (128, 256)
    split_k = default_split_k(triton.cdiv(n, block_n), triton.cdiv(k, block_k), 4)
    return GemvConfig(block_n, block_k, split_k, num_warps=4, num_stages=3, dot=m > 1)


def _tuned_key(m, n, k, gated):
    return ("gated" if gated else "linear", rows_bucket(m), n, k)


def select_config(m: int, n: int, k: int, gated: bool = False) -> GemvConfig:
    return TUNED.get(_tuned_key(m, n, k, gated)) or default_config(m, n, k)


@triton.jit
def _fp8_gemv_kernel(x_ptr, w_ptr, ws_ptr, bias_ptr, y_ptr, partial_ptr, count_ptr, amax_ptr,
                     xp_ptr, wp_ptr, M, N, K, HAS_AMAX: tl.constexpr, HAS_BIAS: tl.constexpr,
                     GATED: tl.constexpr, USE_DOT: tl.constexpr, PACKED: tl.constexpr,
                     X_F16: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
                     NUM_STAGES: tl.constexpr, AMAX_BLOCK: tl.constexpr, COMPILED: tl.constexpr,
                     PDL: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n, rows, offs_m, offs_k, w_gate, w_up, x_tile, m_mask = row_tiles(
        x_ptr, w_ptr, pid_n, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)

    wait_for_previous_grid(PDL)
    # per-token scale over the whole row, as quantization/fp8.quantize_rows: given, or in
    # AMAX_BLOCK chunks (see amax_block), a pass every program makes before its first weight load
    if HAS_AMAX:
        amax = tl.load(amax_ptr + offs_m, mask=offs_m < M, other=0.0)
    else:
        amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
        offs_a = tl.arange(0, AMAX_BLOCK)
        for k in range(0, K, AMAX_BLOCK):
            xa = tl.load(x_ptr + offs_m[:, None] * K + k + offs_a[None, :],
                         mask=m_mask & (offs_a[None, :] < K - k), other=0.0)
            amax = tl.maximum(amax, tl.max(tl.abs(xa.to(tl.float32)), axis=1))
    x_scale = row_scale(amax)
    x_inv = tl.div_rn(tl.full(x_scale.shape, 1.0, tl.float32), x_scale)

    k_start, k_end = split_k_range(pid_k, K, BLOCK_K, SPLIT_K)
    if PACKED:
        acc, acc_up = _packed_products(xp_ptr, wp_ptr, rows, N, K, k_start, k_end, x_scale,
                                       x_inv, GATED, PACKED, X_F16, BLOCK_N, BLOCK_K, EVEN_K,
                                       NUM_STAGES, COMPILED)
        x_scale = x_scale / PAIR_SCALE     # the pairs' activations came scaled by PAIR_SCALE
    else:
        acc, acc_up = _products(x_tile, w_gate, w_up, offs_k, m_mask, K, k_start, k_end,
                                x_scale, x_inv, GATED, USE_DOT, BLOCK_M, BLOCK_N, BLOCK_K,
                                EVEN_K, NUM_STAGES)
    let_dependents_launch(PDL)
    out, out_up = reduce_accumulators(acc, acc_up, USE_DOT)
    out = out * x_scale[None, :] * tl.load(ws_ptr + rows)[:, None]
    if GATED:
        out_up = out_up * x_scale[None, :] * tl.load(ws_ptr + rows + N)[:, None]
    finish_split_k(y_ptr, bias_ptr, partial_ptr, count_ptr, out, out_up, rows, offs_m, offs_n,
                   pid_n, pid_k, M, N, HAS_BIAS, GATED, SPLIT_K)


@triton.jit
def _products(x_tile, w_gate, w_up, offs_k, m_mask, K, k_start, k_end, x_scale, x_inv,
              GATED: tl.constexpr, USE_DOT: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
              NUM_STAGES: tl.constexpr):
    """The (gate, up) accumulators of ``zero_accumulators`` over K chunks [k_start, k_end):
    each activation tile quantized, then e4m3 products on tensor cores or in fp32."""
    acc, acc_up = zero_accumulators(USE_DOT, BLOCK_M, BLOCK_N, BLOCK_K)
    for k in tl.range(k_start, k_end, BLOCK_K, num_stages=NUM_STAGES):
        x, w, w2 = load_k_tile(x_tile, w_gate, w_up, k, offs_k, m_mask, K, GATED, EVEN_K)
        xq = tl.clamp(_divide(x.to(tl.float32), x_scale[:, None], x_inv[:, None]), -FP8_MAX,
                      FP8_MAX)
        xq = xq.to(tl.float8e4nv)
        if USE_DOT:
            xt = tl.trans(xq)
            acc = tl.dot(w, xt, acc, max_num_imprecise_acc=BLOCK_K)
            if GATED:
                acc_up = tl.dot(w2, xt, acc_up, max_num_imprecise_acc=BLOCK_K)
        else:
            xq = xq.to(tl.float32)
            acc += w.to(tl.float32) * xq
            if GATED:
                acc_up += w2.to(tl.float32) * xq
    return acc, acc_up


def _f16_pair_words_asm(words: int) -> str:
    """PTX (sm_89+) for ``words`` weight words (4 e4m3 each) against their activations, two f16
    pairs a word: each 16-bit half of a word becomes an f16 pair with one cvt (exact), its
    products and their running sum in the pair's lanes by fma.rn.f16x2, then the two lanes
    added in fp32. $1..$words the words, then each word's two activation pairs; $0 the sum."""
    lines = [".reg .b16 lo, hi;", ".reg .b32 w, acc;", ".reg .f32 a, b;"]
    for word in range(words):
        lines.append(f"mov.b32 {{lo, hi}}, ${word + 1};")
        for half, src in enumerate(("lo", "hi")):
            x = f"${words + 2 * word + half + 1}"
            lines.append(f"cvt.rn.f16x2.e4m3x2 w, {src};")
            lines.append(f"mul.rn.f16x2 acc, w, {x};" if word == half == 0
                         else f"fma.rn.f16x2 acc, w, {x}, acc;")
    lines += ["mov.b32 {lo, hi}, acc;", "cvt.f32.f16 a, lo;", "cvt.f32.f16 b, hi;",
              "add.f32 $0, a, b;"]
    return "{\n" + "\n".join(lines) + "\n}"


_ONE_WORD_ASM = tl.constexpr(_f16_pair_words_asm(1))
_TWO_WORDS_ASM = tl.constexpr(_f16_pair_words_asm(2))
_FOUR_WORDS_ASM = tl.constexpr(_f16_pair_words_asm(4))


@triton.jit
def _e4m3_value(byte):
    """An e4m3 byte (int32 0..255) as its fp32 value, exactly: the interpreter's cvt."""
    exp = ((byte >> 3) & 0xF).to(tl.int32)
    mant = (byte & 7).to(tl.float32)
    mag = tl.where(exp == 0, mant * 0.001953125,
                   (mant + 8.0) * tl.exp2((exp - 10).to(tl.float32)))
    return tl.where((byte & 0x80) != 0, -mag, mag)


@triton.jit
def _word_sum_fp32(word, xa, xb):
    """A word's four products with its two activation pairs, summed in fp32 (the interpreter
    runs no PTX: the sum of the f16 pairs' arithmetic without its roundings)."""
    a0, a1 = f16_lanes(xa)
    b0, b1 = f16_lanes(xb)
    return (_e4m3_value(word & 0xFF) * a0 + _e4m3_value((word >> 8) & 0xFF) * a1
            + _e4m3_value((word >> 16) & 0xFF) * b0 + _e4m3_value((word >> 24) & 0xFF) * b1)


@triton.jit
def _word_sums(words, xa, xb, PACKED: tl.constexpr, COMPILED: tl.constexpr):
    """sum of the products over PACKED adjacent words, fp32 [BN, BW / PACKED]: words [BN, BW]
    (uint32), xa and xb [1, BW] each word's activation pairs (``_quantized_pairs``)."""
    if not COMPILED:
        sums = _word_sum_fp32(words, xa, xb)
        for _ in tl.static_range(PACKED // 2):
            sums = tl.sum(tl.reshape(sums, (sums.shape[0], sums.shape[1] // 2, 2)), axis=2)
    elif PACKED == 1:
        sums = tl.inline_asm_elementwise(_ONE_WORD_ASM, "=f,r,r,r", [words, xa, xb],
                                         dtype=tl.float32, is_pure=True, pack=1)
    elif PACKED == 2:
        w0, w1 = halves(words)
        a0, a1 = halves(xa)
        b0, b1 = halves(xb)
        sums = tl.inline_asm_elementwise(_TWO_WORDS_ASM, "=f,r,r,r,r,r,r",
                                         [w0, w1, a0, b0, a1, b1], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        w0, w1 = halves(words)
        a0, a1 = halves(xa)
        b0, b1 = halves(xb)
        w00, w01 = halves(w0)
        w10, w11 = halves(w1)
        a00, a01 = halves(a0)
        a10, a11 = halves(a1)
        b00, b01 = halves(b0)
        b10, b11 = halves(b1)
        sums = tl.inline_asm_elementwise(_FOUR_WORDS_ASM, "=f,r,r,r,r,r,r,r,r,r,r,r,r",
                                         [w00, w01, w10, w11, a00, b00, a01, b01, a10, b10,
                                          a11, b11], dtype=tl.float32, is_pure=True, pack=1)
    return sums


@triton.jit
def _quantized_lane(x, x_scale, x_inv):
    """One activation lane (fp32) quantized to e4m3 as ``_products`` does, times PAIR_SCALE,
    as f16 bits (exact: an e4m3 value scaled by a power of two)."""
    q = tl.clamp(_divide(x, x_scale, x_inv), -FP8_MAX, FP8_MAX).to(tl.float8e4nv)
    return (q.to(tl.float32) * PAIR_SCALE).to(tl.float16).to(tl.uint16, bitcast=True)


@triton.jit
def _quantized_pairs(xi, x_scale, x_inv, X_F16: tl.constexpr):
    """Two 16-bit activations (an int32 of x) quantized, as one f16 pair (uint32)."""
    xu = xi.to(tl.uint32, bitcast=True)
    if X_F16:
        lo, hi = f16_lanes(xu)
    else:
        lo, hi = bf16_lanes(xu)
    return (_quantized_lane(lo, x_scale, x_inv).to(tl.uint32)
            | (_quantized_lane(hi, x_scale, x_inv).to(tl.uint32) << 16))


@triton.jit
def _packed_products(xp_ptr, wp_ptr, rows, N, K, k_start, k_end, x_scale, x_inv,
                     GATED: tl.constexpr, PACKED: tl.constexpr, X_F16: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                     NUM_STAGES: tl.constexpr, COMPILED: tl.constexpr):
    """One row's (gate, up) sums [BLOCK_N, BLOCK_K / 4 / PACKED] over K chunks [k_start,
    k_end) in f16 pairs: wp the weight as int32 words (4 e4m3, K / 4 a row), xp the activations
    as int32 pairs (K / 2). A word's activations (4w .. 4w + 3) are pairs 2w and 2w + 1,
    quantized once a chunk and shared by every row the thread holds."""
    BW: tl.constexpr = BLOCK_K // 4
    offs_w = tl.arange(0, BW)
    words_per_row = K // 4
    w_gate = wp_ptr + rows[:, None] * words_per_row + offs_w[None, :]
    w_up = wp_ptr + (rows + N)[:, None] * words_per_row + offs_w[None, :]
    x_pairs = xp_ptr + 2 * offs_w[None, :]
    acc = tl.zeros((BLOCK_N, BW // PACKED), dtype=tl.float32)
    acc_up = tl.zeros_like(acc)
    for k in tl.range(k_start, k_end, BLOCK_K, num_stages=NUM_STAGES):
        kw = k // 4
        if EVEN_K:
            w = tl.load(w_gate + kw)
            xa = tl.load(x_pairs + k // 2)
            xb = tl.load(x_pairs + k // 2 + 1)
            w2 = w
            if GATED:
                w2 = tl.load(w_up + kw)
        else:       # words past K are zeros, and so are their products
            w_mask = offs_w[None, :] < words_per_row - kw
            w = tl.load(w_gate + kw, mask=w_mask, other=0)
            xa = tl.load(x_pairs + k // 2, mask=w_mask, other=0)
            xb = tl.load(x_pairs + k // 2 + 1, mask=w_mask, other=0)
            w2 = w
            if GATED:
                w2 = tl.load(w_up + kw, mask=w_mask, other=0)
        xa = _quantized_pairs(xa, x_scale, x_inv, X_F16)
        xb = _quantized_pairs(xb, x_scale, x_inv, X_F16)
        acc += _word_sums(w.to(tl.uint32, bitcast=True), xa, xb, PACKED, COMPILED)
        if GATED:
            acc_up += _word_sums(w2.to(tl.uint32, bitcast=True), xa, xb, PACKED, COMPILED)
    return acc, acc_up


@triton.jit
def _divide(x, s, inv):
    """x / s as quantization/fp8.quantize_rows divides, from inv = 1 / s (correctly rounded):
    the product x * inv and one correction by its remainder, exact under an FMA (Markstein's
    final step). x * inv alone is an ulp off often enough to move e4m3 roundings: bf16 rows
    whose amax is 3.875 or 4.3125 quantized ~30 of 4096 elements a step apart, 1% of the
    product; an IEEE division (div_rn) per element cost gate_up 29.9 -> 40.2 us on the H200.
    Over every bf16 x and every bf16 amax in [1e-3, 1e4] (98 M pairs, float64-emulated FMAs)
    this gives quantize_rows' e4m3 values in all cases."""
    q = x * inv
    return tl.fma(tl.fma(-q, s, x), inv, q)


def supports(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
             gated: bool = False) -> bool:
    """Whether the GEMV handles this call and is not slower than ``_scaled_mm`` where
    measured."""
    if not ENABLED or not x.is_cuda or x.dtype not in DTYPES or not weight.is_contiguous():
        return False
    n, k = weight.shape
    if k == 0 or x.shape[-1] != k:
        return False
    m = x.numel() // k
    if not 1 <= m <= MAX_ROWS:
        return False
    if gated and (n % 2 or bias is not None):
        return False
    key = _tuned_key(m, n // 2 if gated else n, k, gated)
    return key not in TUNED or TUNED[key] is not None


def _launch(x, weight, weight_scale, bias, n, gated, config, row_amax):
    k = weight.shape[1]
    x2 = as_rows(x, k, MAX_ROWS)
    m = x2.shape[0]
    cfg = config or select_config(m, n, k, gated)
    assert cfg.dot or m == 1, "the CUDA-core path computes one row; more need dot=True"
    assert row_amax is None or (row_amax.dtype == torch.float32 and row_amax.numel() == m)
    if cfg.packed and (cfg.dot or k % 4):    # f16 pairs: one row, whole words
        cfg = cfg._replace(packed=0)
    assert cfg.packed in (0, *PACKED_WORDS) and cfg.block_k % (4 * max(cfg.packed, 1)) == 0
    y, tiles, partials, counts = launch_buffers(x, m, n, cfg, gated)
    packed = cfg.packed > 0
    _fp8_gemv_kernel[(tiles, cfg.split_k)](
        x2, weight, weight_scale, bias if bias is not None else weight_scale, y, partials,
        counts, row_amax if row_amax is not None else weight_scale,
        as_int32_pairs(x2) if packed else x2, weight.view(torch.int32) if packed else weight,
        m, n, k, HAS_AMAX=row_amax is not None, HAS_BIAS=bias is not None, GATED=gated,
        USE_DOT=cfg.dot, PACKED=cfg.packed, X_F16=x.dtype == torch.float16,
        BLOCK_M=max(DOT_MIN_ROWS, next_power_of_2(m)) if cfg.dot else 1,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
        EVEN_K=k % cfg.block_k == 0, NUM_STAGES=cfg.num_stages,
        AMAX_BLOCK=amax_block(k, cfg), COMPILED=os.environ.get("TRITON_INTERPRET") != "1",
        num_warps=cfg.num_warps, **pdl.launch_options(x.device))
    return y.view(*x.shape[:-1], n)


def amax_block(k: int, cfg: GemvConfig) -> int:
    """The amax pass's chunk: BLOCK_K for tensor-core configs (up to 16 rows a chunk). One row
    behind 1024-wide weight tiles, up to 8192 activations (the whole row at K = 4096, two chunks
    at 13,696): on the H200 down 21.8 -> 17.3 us and o_proj 8.2 -> 7.3; behind 512-wide tiles,
    BLOCK_K, since a 4096 chunk there cost gate_up 40.1 -> 41.5 us and qkv 10.2 -> 11.5
    (scripts/gpu/quant_gemv_depth.py, BENCHMARKS.md)."""
    if cfg.dot or cfg.block_k < 1024:
        return cfg.block_k
    return max(cfg.block_k, min(next_power_of_2(k), 8192))


def fp8_gemv(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
             bias: torch.Tensor | None = None, config: GemvConfig | None = None,
             row_amax: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] 16-bit (<= MAX_ROWS rows), weight e4m3 [N, K], weight_scale fp32 [N]
    -> [..., N] in x's dtype. row_amax: fp32 [rows], each row's max |x| exactly (it sets the
    row's scale), or None: the kernel computes it."""
    return _launch(x, weight, weight_scale, bias, weight.shape[0], False, config, row_amax)


def fp8_gated_gemv(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                   config: GemvConfig | None = None,
                   row_amax: torch.Tensor | None = None) -> torch.Tensor:
    """silu(x @ gate^T) * (x @ up^T) for an e4m3 [gate; up] weight of 2I rows -> [..., I]."""
    assert weight.shape[0] % 2 == 0
    return _launch(x, weight, weight_scale, None, weight.shape[0] // 2, True, config,
                   row_amax)
