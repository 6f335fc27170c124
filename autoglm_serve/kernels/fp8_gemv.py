"""Decode GEMV for FP8 W8A8: e4m3 weights with one fp32 scale per output channel, activations
quantized per token inside the kernel, for 1..MAX_ROWS rows (more rows: quantization/fp8.py's
``torch._scaled_mm``, whose numerics this kernel keeps).

At M = 1 the ``_scaled_mm`` path is 4 torch ops for the activation's scale and cast plus a GEMM
tuned for large M: slower than the bf16 GEMV despite half the bytes. Here, as kernels/gemv.py
(same GemvConfig, split-K with the deterministic last-program reduction, PDL, graph-safe
workspaces):

- each program first computes the amax of its activation rows over all of K (x is a few KB and
  sits in L2), so the per-token scale needs no other kernel;
- in the K loop the activation tile is quantized the same way (x * (1 / scale), saturated,
  rounded to e4m3); the products of two e4m3 values are exact in fp32, so the sum is the W8A8
  product ``_scaled_mm`` computes, up to summation order: on CUDA cores (one row, compiled)
  ``_fp8_row_kernel`` quantizes each program's run of x once, converts 4 weights a word with
  PTX cvt e4m3x2 -> f16x2 and multiplies them in packed halves, exact products in chains of
  8 summed in f16, then in fp32 (see there; 1.5-1.8 instructions per weight in the sm_90 SASS
  where the elementwise fp32 version, the interpreter's, took 3.8-4.8); with ``dot=True`` both e4m3 tiles go to the tensor cores as
  they are (Hopper's FP8 wgmma, ~1-2 instructions per weight in the sm_90 SASS where
  converting the weights to bf16 first took 4.2; tiles of >= 64 rows, fewer fall back to the
  converting MMA). That MMA sums a chunk in an accumulator of fewer bits than fp32's, so each
  BLOCK_K chunk is added to the fp32 accumulator on its own (``max_num_imprecise_acc``);
- the fp32 result is scaled by x_scale * w_scale[n] before the split-K reduction (linear, so the
  partials may be scaled each), then bias or SiLU gating as in the bf16 GEMV.

``TUNED`` is keyed (kind, rows bucket, N, K), filled by scripts/gpu/quant_gemv_bench.py; None
there means ``_scaled_mm`` was faster. quantization/kernel_checks.py compares the kernel against
the W8A8 reference at start-up and sets ``ENABLED = False`` on a problem.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from autoglm_serve.kernels import pdl
from autoglm_serve.kernels.gemv import (GemvConfig, as_rows, default_split_k, finish_split_k,
                                        launch_buffers, load_k_tile, reduce_accumulators,
                                        row_tiles, rows_bucket, split_k_range,
                                        zero_accumulators)
from autoglm_serve.kernels.pdl import wait_for_previous_grid

ENABLED = True
MAX_ROWS = 8
DOT_MIN_ROWS = 16
DTYPES = (torch.bfloat16, torch.float16)
FP8_MAX = tl.constexpr(448.0)       # constexpr: a global the kernels read
MIN_SCALE = tl.constexpr(1e-12)     # as quantization/fp8.py

# (kind, rows bucket, N, K) -> config (or None: _scaled_mm), from the H200.
# (scripts/gpu/quant_gemv_bench.py, 2026-12-01; comments: this config, the fallback). One row:
# untuned since the packed-half kernel (the fp32 one took 40.6, 21.9, 10.3, 8.2 us at gate_up,
# down, qkv, o_proj in 8 x 512 or 8 x 1024 tiles)
TUNED: dict[tuple[str, int, int, int], GemvConfig | None] = {
    ('gated', 2, 13696, 4096): GemvConfig(128, 128, 2, 4, 3, True),  # 45.1 us, _scaled_mm 48.8
    ('gated', 4, 13696, 4096): GemvConfig(64, 128, 1, 8, 4, True),  # 41.2 us, _scaled_mm 49.0
    ('gated', 8, 13696, 4096): GemvConfig(64, 128, 1, 8, 4, True),  # 41.6 us, _scaled_mm 52.4
    ('linear', 2, 4096, 13696): GemvConfig(64, 256, 4, 4, 3, True),  # 36.6 us, _scaled_mm 50.1
    ('linear', 4, 4096, 13696): GemvConfig(64, 256, 4, 8, 4, True),  # 36.3 us, _scaled_mm 51.2
    ('linear', 8, 4096, 13696): GemvConfig(64, 256, 4, 8, 4, True),  # 36.6 us, _scaled_mm 47.9
    ('linear', 2, 4608, 4096): GemvConfig(64, 256, 4, 4, 3, True),  # 13.8 us, _scaled_mm 20.6
    ('linear', 4, 4608, 4096): GemvConfig(64, 256, 4, 4, 3, True),  # 14.4 us, _scaled_mm 21.0
    ('linear', 8, 4608, 4096): GemvConfig(64, 256, 4, 4, 3, True),  # 14.6 us, _scaled_mm 20.2
    ('linear', 2, 4096, 4096): GemvConfig(64, 256, 4, 4, 3, True),  # 12.4 us, _scaled_mm 16.9
    ('linear', 4, 4096, 4096): GemvConfig(64, 256, 4, 4, 3, True),  # 12.9 us, _scaled_mm 16.9
    ('linear', 8, 4096, 4096): GemvConfig(64, 256, 4, 4, 3, True),  # 13.0 us, _scaled_mm 16.3
}


def default_config(m: int, n: int, k: int) -> GemvConfig:
    """Untuned: split-K up to ~256 programs; one row on CUDA cores in 128 x 128 tiles of the
    packed-half kernel (``_fp8_row_kernel``: 1.8 instructions per weight in the sm_90 SASS,
    gated 1.6; 128 x 256 gated 1.5), more rows in 128 x 256 e4m3 tensor-core tiles (1.3, the
    activations' quantization most of it; 128 x 128: 1.6)."""
    block_n, block_k = (128, 128) if m == 1 else (128, 256)
    split_k = default_split_k(triton.cdiv(n, block_n), triton.cdiv(k, block_k), 4)
    return GemvConfig(block_n, block_k, split_k, num_warps=4, num_stages=3, dot=m > 1)


def _tuned_key(m, n, k, gated):
    return ("gated" if gated else "linear", rows_bucket(m), n, k)


def select_config(m: int, n: int, k: int, gated: bool = False) -> GemvConfig:
    return TUNED.get(_tuned_key(m, n, k, gated)) or default_config(m, n, k)


@triton.jit
def _fp8_gemv_kernel(x_ptr, w_ptr, ws_ptr, bias_ptr, y_ptr, partial_ptr, count_ptr, M, N, K,
                     HAS_BIAS: tl.constexpr, GATED: tl.constexpr, USE_DOT: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, NUM_STAGES: tl.constexpr,
                     PDL: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n, rows, offs_m, offs_k, w_gate, w_up, x_tile, m_mask = row_tiles(
        x_ptr, w_ptr, pid_n, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)

    wait_for_previous_grid(PDL)
    # per-token scale over the whole row, as quantization/fp8.quantize_rows
    amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        xa = tl.load(x_tile + k, mask=m_mask & (offs_k[None, :] < K - k), other=0.0)
        amax = tl.maximum(amax, tl.max(tl.abs(xa.to(tl.float32)), axis=1))
    x_scale = tl.maximum(tl.div_rn(amax, FP8_MAX), MIN_SCALE)
    # a multiply per activation, not a division: x * (1 / s) may differ from x / s by an ulp,
    # which moves an e4m3 rounding only at a tie boundary (rare, one ulp of one element)
    x_inv = tl.div_rn(tl.full(x_scale.shape, 1.0, tl.float32), x_scale)

    k_start, k_end = split_k_range(pid_k, K, BLOCK_K, SPLIT_K)
    acc, acc_up = zero_accumulators(USE_DOT, BLOCK_M, BLOCK_N, BLOCK_K)
    for k in tl.range(k_start, k_end, BLOCK_K, num_stages=NUM_STAGES):
        x, w, w2 = load_k_tile(x_tile, w_gate, w_up, k, offs_k, m_mask, K, GATED, EVEN_K)
        xq = tl.clamp(x.to(tl.float32) * x_inv[:, None], -FP8_MAX, FP8_MAX)
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
    out, out_up = reduce_accumulators(acc, acc_up, USE_DOT)
    out = out * x_scale[None, :] * tl.load(ws_ptr + rows)[:, None]
    if GATED:
        out_up = out_up * x_scale[None, :] * tl.load(ws_ptr + rows + N)[:, None]
    finish_split_k(y_ptr, bias_ptr, partial_ptr, count_ptr, out, out_up, rows, offs_m, offs_n,
                   pid_n, pid_k, M, N, HAS_BIAS, GATED, SPLIT_K)


# The one-row CUDA-core path, compiled (the interpreter runs no PTX: ``_fp8_gemv_kernel``
# there). Products of two e4m3 values have <= 8 significant bits: with the activation taken as
# xq / 32 they are exact in f16 (smallest bit 2**-9 * 2**-14 >= f16's 2**-24, largest
# 448 * 14 = 6272, eight of them 50176 < 65504), so a word of four weights is converted (cvt
# e4m3x2 -> f16x2, two per word) and multiplied in packed halves (HFMA2, two weights an
# instruction); each half's chain of 8 products (four words, one of each quarter tile) is
# rounded to f16's 11 bits 7 times, then both halves go into the fp32 accumulator. That is
# less rounding than the e4m3 tensor-core path above (up to BLOCK_K products in its
# reduced-precision accumulator).
def _x_pairs_asm(widen: str) -> tl.constexpr:
    """The PTX of ``_quantized_x_pairs`` for a way to widen the 16-bit pairs p0, p1 to f32."""
    return tl.constexpr(
        "{ .reg .b32 p0, p1, c; .reg .f32 f0, f1, f2, f3; .reg .b16 h0, h1, q;\n"
        "mov.b64 {p0, p1}, $2;\n" + widen + "\n"
        "mov.b32 c, 0x28002800;\n"          # 2**-5 in both f16 halves
        "mul.rn.f32 f0, f0, $3; mul.rn.f32 f1, f1, $3;\n"
        "mul.rn.f32 f2, f2, $3; mul.rn.f32 f3, f3, $3;\n"
        # the first source goes to the upper half: (f1, f0) puts activation 0 in the low one
        "cvt.rn.satfinite.e4m3x2.f32 q, f1, f0; cvt.rn.f16x2.e4m3x2 $0, q;\n"
        "mul.rn.f16x2 $0, $0, c;\n"
        "cvt.rn.satfinite.e4m3x2.f32 q, f3, f2; cvt.rn.f16x2.e4m3x2 $1, q;\n"
        "mul.rn.f16x2 $1, $1, c; }")


_X_PAIRS_BF16 = _x_pairs_asm("shl.b32 f0, p0, 16; and.b32 f1, p0, 0xffff0000; "
                             "shl.b32 f2, p1, 16; and.b32 f3, p1, 0xffff0000;")
_X_PAIRS_F16 = _x_pairs_asm("mov.b32 {h0, h1}, p0; cvt.f32.f16 f0, h0; cvt.f32.f16 f1, h1; "
                            "mov.b32 {h0, h1}, p1; cvt.f32.f16 f2, h0; cvt.f32.f16 f3, h1;")


@triton.jit
def _quantized_x_pairs(x4, x_inv, X_F16: tl.constexpr):
    """Four 16-bit activations (one int64) -> two f16x2 words (activations 0,1 and 2,3) of
    e4m3(x * x_inv) / 32: the per-token W8A8 quantization of ``_fp8_gemv_kernel``
    (cvt.satfinite saturates at +-448 as its clamp does), then exactly scaled into f16."""
    if X_F16:
        pairs = tl.inline_asm_elementwise(_X_PAIRS_F16, "=r,=r,l,f", [x4, x_inv],
                                          dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
    else:
        pairs = tl.inline_asm_elementwise(_X_PAIRS_BF16, "=r,=r,l,f", [x4, x_inv],
                                          dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
    return pairs


@triton.jit
def _four_word_products(acc, w0, w1, w2, w3, x0, x1, x2, x3):
    """acc (fp32) += the 16 products of words w0..w3 (4 e4m3 weights each, weight j in byte j)
    with their activations x0..x3 (int64: ``_quantized_x_pairs``' two f16x2 words), one chain
    of packed f16 fmas (8 products a half), then both halves into fp32: 8 cvt, 8 HFMA2,
    2 cvt, 2 add."""
    return tl.inline_asm_elementwise(
        """{ .reg .b16 lo, hi; .reg .b32 a, b, h, xa, xb; .reg .f32 s0, s1;
        mov.b64 {xa, xb}, $5;
        mov.b32 {lo, hi}, $1; cvt.rn.f16x2.e4m3x2 a, lo; cvt.rn.f16x2.e4m3x2 b, hi;
        mul.rn.f16x2 h, a, xa; fma.rn.f16x2 h, b, xb, h;
        mov.b64 {xa, xb}, $6;
        mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 a, lo; cvt.rn.f16x2.e4m3x2 b, hi;
        fma.rn.f16x2 h, a, xa, h; fma.rn.f16x2 h, b, xb, h;
        mov.b64 {xa, xb}, $7;
        mov.b32 {lo, hi}, $3; cvt.rn.f16x2.e4m3x2 a, lo; cvt.rn.f16x2.e4m3x2 b, hi;
        fma.rn.f16x2 h, a, xa, h; fma.rn.f16x2 h, b, xb, h;
        mov.b64 {xa, xb}, $8;
        mov.b32 {lo, hi}, $4; cvt.rn.f16x2.e4m3x2 a, lo; cvt.rn.f16x2.e4m3x2 b, hi;
        fma.rn.f16x2 h, a, xa, h; fma.rn.f16x2 h, b, xb, h;
        mov.b32 {lo, hi}, h; cvt.f32.f16 s0, lo; cvt.f32.f16 s1, hi;
        add.rn.f32 s0, s0, s1; add.rn.f32 $0, $9, s0; }""",
        "=f,r,r,r,r,l,l,l,l,f", [w0, w1, w2, w3, x0, x1, x2, x3, acc], dtype=tl.float32,
        is_pure=True, pack=1)


@triton.jit
def _fp8_row_kernel(x_ptr, x4_ptr, xq_ptr, w_ptr, ws_ptr, bias_ptr, y_ptr, partial_ptr,
                    count_ptr, N, K, words, HAS_BIAS: tl.constexpr, GATED: tl.constexpr,
                    X_F16: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    SPLIT_K: tl.constexpr, NUM_STAGES: tl.constexpr, PDL: tl.constexpr):
    """One activation row, K a multiple of BLOCK_K. w_ptr: the e4m3 weight as int32 words
    ([N, K / 4], ``words`` per row, an argument so Triton sees its divisibility: 16-byte loads),
    x4_ptr: x as int64 (4 activations each), xq_ptr: an int64 scratch of K / 4 (``_scratch``).

    A program first quantizes its run of x once into the scratch (so the K loop does not redo
    it in every thread that holds the same activations for other rows; programs of the same
    split write the same bits there) and waits for its threads (a barrier: a CTA's global
    writes are then visible to its threads). A K step is four quarter tiles of BLOCK_K / 16
    words per row, word i of each meeting in ``_four_word_products``."""
    QW: tl.constexpr = BLOCK_K // 16         # words per row in each quarter tile
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(offs_n, N - 1).to(tl.int64)
    offs_w = tl.arange(0, QW)
    w_gate = w_ptr + rows[:, None] * words + offs_w[None, :]
    w_up = w_ptr + (rows + N)[:, None] * words + offs_w[None, :]
    xq_tile = xq_ptr + offs_w[None, :]

    wait_for_previous_grid(PDL)
    offs_k = tl.arange(0, BLOCK_K)
    amax = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        amax = tl.maximum(amax, tl.abs(tl.load(x_ptr + k + offs_k).to(tl.float32)))
    x_scale = tl.maximum(tl.div_rn(tl.max(amax, axis=0), FP8_MAX), MIN_SCALE)
    offs_4 = tl.arange(0, BLOCK_K // 4)
    x_inv = tl.div_rn(1.0, x_scale) + tl.zeros((BLOCK_K // 4,), dtype=tl.float32)

    k_start, k_end = split_k_range(pid_k, K, BLOCK_K, SPLIT_K)
    for k in range(k_start, k_end, BLOCK_K):
        xa, xb = _quantized_x_pairs(tl.load(x4_ptr + k // 4 + offs_4), x_inv, X_F16)
        packed = (xa.to(tl.int64) & 0xFFFFFFFF) | (xb.to(tl.int64) << 32)
        tl.store(xq_ptr + k // 4 + offs_4, packed)
    tl.debug_barrier()

    acc = tl.zeros((BLOCK_N, QW), dtype=tl.float32)
    acc_up = tl.zeros_like(acc)
    for k in tl.range(k_start, k_end, BLOCK_K, num_stages=NUM_STAGES):
        wk = k // 4
        x0 = tl.load(xq_tile + wk)
        x1 = tl.load(xq_tile + wk + QW)
        x2 = tl.load(xq_tile + wk + 2 * QW)
        x3 = tl.load(xq_tile + wk + 3 * QW)
        g = w_gate + wk
        acc = _four_word_products(acc, tl.load(g), tl.load(g + QW), tl.load(g + 2 * QW),
                                  tl.load(g + 3 * QW), x0, x1, x2, x3)
        if GATED:
            u = w_up + wk
            acc_up = _four_word_products(acc_up, tl.load(u), tl.load(u + QW),
                                         tl.load(u + 2 * QW), tl.load(u + 3 * QW), x0, x1, x2,
                                         x3)
    # x 32 undoes the activations' 2**-5; per-token and per-channel scales, as the kernel above
    scale = x_scale * 32.0
    out = tl.sum(acc, axis=1, keep_dims=True) * scale * tl.load(ws_ptr + rows)[:, None]
    out_up = tl.sum(acc_up, axis=1, keep_dims=True)
    if GATED:
        out_up = out_up * scale * tl.load(ws_ptr + rows + N)[:, None]
    finish_split_k(y_ptr, bias_ptr, partial_ptr, count_ptr, out, out_up, rows,
                   tl.arange(0, 1), offs_n, pid_n, pid_k, 1, N, HAS_BIAS, GATED, SPLIT_K)


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


# (device, K) -> int64 [K / 4]: the one-row kernel's quantized activations, allocated once (a
# captured CUDA graph keeps pointing at it). Every launch rewrites what it reads after its wait
# for the previous kernel (pdl.py's contract keeps a stream's kernels in order), so one buffer
# serves every shape of that K; like gemv.workspace's split-K counters, it assumes no two of
# these GEMVs run at once on different streams.
_scratches: dict[tuple, torch.Tensor] = {}


def _scratch(device, k: int) -> torch.Tensor:
    if (device, k) not in _scratches:
        _scratches[device, k] = torch.empty(k // 4, dtype=torch.int64, device=device)
    return _scratches[device, k]


def _row_kernel_runs(x2, weight, cfg) -> bool:
    """The packed-half one-row kernel: compiled (not the interpreter), K whole tiles of >= 64,
    x's rows viewable as int64 and the weight as int32 words."""
    k = weight.shape[1]
    return (not cfg.dot and x2.shape[0] == 1 and os.environ.get("TRITON_INTERPRET") != "1"
            and x2.dtype in (torch.bfloat16, torch.float16) and cfg.block_k >= 64
            and k % cfg.block_k == 0 and x2.data_ptr() % 8 == 0 and weight.data_ptr() % 16 == 0)


def _launch(x, weight, weight_scale, bias, n, gated, config):
    k = weight.shape[1]
    x2 = as_rows(x, k, MAX_ROWS)
    m = x2.shape[0]
    cfg = config or select_config(m, n, k, gated)
    assert cfg.dot or m == 1, "the CUDA-core path computes one row; more need dot=True"
    y, tiles, partials, counts = launch_buffers(x, m, n, cfg, gated)
    if _row_kernel_runs(x2, weight, cfg):
        _fp8_row_kernel[(tiles, cfg.split_k)](
            x2, x2.view(torch.int64), _scratch(x.device, k), weight.view(torch.int32),
            weight_scale,
            bias if bias is not None else weight_scale, y, partials, counts, n, k, k // 4,
            HAS_BIAS=bias is not None, GATED=gated, X_F16=x.dtype == torch.float16,
            BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
            NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps, **pdl.launch_options(x.device))
        return y.view(*x.shape[:-1], n)
    _fp8_gemv_kernel[(tiles, cfg.split_k)](
        x2, weight, weight_scale, bias if bias is not None else weight_scale, y, partials,
        counts, m, n, k, HAS_BIAS=bias is not None, GATED=gated, USE_DOT=cfg.dot,
        BLOCK_M=max(DOT_MIN_ROWS, triton.next_power_of_2(m)) if cfg.dot else 1,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
        EVEN_K=k % cfg.block_k == 0, NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps,
        **pdl.launch_options(x.device))
    return y.view(*x.shape[:-1], n)


def fp8_gemv(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
             bias: torch.Tensor | None = None, config: GemvConfig | None = None) -> torch.Tensor:
    """x [..., K] 16-bit (<= MAX_ROWS rows), weight e4m3 [N, K], weight_scale fp32 [N]
    -> [..., N] in x's dtype."""
    return _launch(x, weight, weight_scale, bias, weight.shape[0], False, config)


def fp8_gated_gemv(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                   config: GemvConfig | None = None) -> torch.Tensor:
    """silu(x @ gate^T) * (x @ up^T) for an e4m3 [gate; up] weight of 2I rows -> [..., I]."""
    assert weight.shape[0] % 2 == 0
    return _launch(x, weight, weight_scale, None, weight.shape[0] // 2, True, config)
