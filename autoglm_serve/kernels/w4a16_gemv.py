"""Decode GEMV for int4 weights with 16-bit activations (W4A16): y = x @ dequant(W)^T (+ bias)
for 1..MAX_ROWS activation rows, the GEMM kernels/wna16.py runs at prefill.

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
  moved into a float's mantissa it is v = 1 + q * 2**-e, and one fma with per-row constants
  gives (q - zero) * scale exactly (``_nibble``, ``_scale_terms``): ~3.5 instructions per
  weight with the accumulating fma, where the instruction issue rate, not HBM, would bound a
  kernel spending 6 or more;
- CUDA cores (``dot=False``, any rows): products accumulated elementwise in fp32 and reduced
  across K once at the end; ``dot=True`` (2..MAX_ROWS rows): eight tensor-core products per
  tile; the sweep picks.
- the gated variant (gate_up followed by SiLU-and-mul) loads rows n and I + n together.

``TUNED`` is keyed (kind, rows bucket, N, K, group) and filled by scripts/gpu/quant_gemv_bench.py;
None there means the prefill kernel (kernels/wna16.py) was faster, so it runs.
quantization/kernel_checks.py compares the kernel against dequantize-then-matmul at start-up
and sets ``ENABLED = False`` on a problem.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from autoglm_serve.kernels import pdl
from autoglm_serve.kernels.gemv import (GemvConfig, as_rows, default_split_k, finish_split_k,
                                        launch_buffers, rows_bucket, split_k_range)
from autoglm_serve.kernels.pdl import wait_for_previous_grid

ENABLED = True
MAX_ROWS = 8
DOT_MIN_ROWS = 16       # tl.dot's smallest tile side for 16-bit operands
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# the bits of 1.0f, passed as an argument so it sits in a register: ptxas then merges the
# nibble's and-mask and this or into one LOP3 (two immediates would take two)
ONE_BITS = 0x3F800000

# (kind, rows bucket, N, K, group) -> config (or None: kernels/wna16.py), from the H200.
# (scripts/gpu/quant_gemv_bench.py, 2026-12-01; comments: this config, the fallback)
TUNED: dict[tuple[str, int, int, int, int], GemvConfig | None] = {
    ('gated', 1, 13696, 4096, 128): GemvConfig(32, 128, 2, 4, 3, False),  # 38.1 us, wna16 228.4
    ('gated', 2, 13696, 4096, 128): GemvConfig(64, 128, 2, 4, 3, True),  # 75.4 us, wna16 217.9
    ('gated', 4, 13696, 4096, 128): GemvConfig(64, 128, 2, 4, 3, True),  # 79.5 us, wna16 217.7
    ('gated', 8, 13696, 4096, 128): GemvConfig(64, 128, 4, 4, 3, True),  # 87.7 us, wna16 217.7
    ('linear', 1, 4096, 13696, 128): GemvConfig(16, 128, 4, 4, 3, False),  # 28.9 us, wna16 114.1
    ('linear', 2, 4096, 13696, 128): GemvConfig(64, 128, 8, 4, 3, True),  # 37.3 us, wna16 110.9
    ('linear', 4, 4096, 13696, 128): GemvConfig(64, 128, 8, 4, 3, True),  # 40.3 us, wna16 110.9
    ('linear', 8, 4096, 13696, 128): GemvConfig(64, 128, 8, 4, 3, True),  # 47.8 us, wna16 110.8
    ('linear', 1, 4608, 4096, 128): GemvConfig(32, 128, 4, 4, 3, False),  # 11.1 us, wna16 59.8
    ('linear', 2, 4608, 4096, 128): GemvConfig(64, 128, 8, 4, 3, True),  # 15.6 us, wna16 57.6
    ('linear', 4, 4608, 4096, 128): GemvConfig(64, 128, 8, 4, 3, True),  # 16.9 us, wna16 57.7
    ('linear', 8, 4608, 4096, 128): GemvConfig(64, 128, 8, 4, 2, True),  # 19.3 us, wna16 57.6
    ('linear', 1, 4096, 4096, 128): GemvConfig(64, 128, 4, 4, 3, False),  # 10.8 us, wna16 35.8
    ('linear', 2, 4096, 4096, 128): GemvConfig(64, 128, 4, 4, 3, True),  # 17.4 us, wna16 36.1
    ('linear', 4, 4096, 4096, 128): GemvConfig(64, 128, 8, 4, 3, True),  # 14.2 us, wna16 36.1
    ('linear', 8, 4096, 4096, 128): GemvConfig(64, 128, 8, 4, 3, True),  # 16.4 us, wna16 36.1
}


def default_config(m: int, n: int, k: int, group: int) -> GemvConfig:
    """Untuned: 64 x 128 tiles, split-K up to ~256 programs. One row on CUDA cores: a thread
    then holds 4 words of 2 rows and loads its x once for both (6.3 instructions per weight
    in the sm_90 SASS, where 32 x 128 takes 8.7 and 8 x 512 11.7). More rows on tensor cores
    (6.7 per weight, whatever the rows; 16 x 256 takes 23, and the CUDA-core path 13 at 2
    rows, 39 at 8)."""
    block_n, block_k = 64, 128
    split_k = default_split_k(triton.cdiv(n, block_n), triton.cdiv(k, block_k), 4)
    return GemvConfig(block_n, block_k, split_k, num_warps=4, num_stages=3, dot=m > 1)


def _tuned_key(m, n, k, group, gated):
    return ("gated" if gated else "linear", rows_bucket(m), n, k, group)


def select_config(m: int, n: int, k: int, group: int, gated: bool = False) -> GemvConfig:
    return TUNED.get(_tuned_key(m, n, k, group, gated)) or default_config(m, n, k, group)


@triton.jit
def _nibble(p, one_bits, J: tl.constexpr):
    """Nibble J of each packed word as v = 1 + q * 2**-e (e = 11 for even J, 7 for odd): moved
    into bits 12..15 or 16..19 of the mantissa of 1.0, so one shift serves two nibbles, one
    and-or makes the float, and no int-to-float conversion (a slow instruction) is needed."""
    if J < 2:
        moved = p << 12
    elif J < 4:
        moved = p << 4
    elif J < 6:
        moved = p >> 4
    else:
        moved = p >> 12
    mask: tl.constexpr = 0xF000 if J % 2 == 0 else 0xF0000
    return ((moved & mask) | one_bits).to(tl.float32, bitcast=True)


@triton.jit
def _scale_terms(s_ptrs, z_ptrs, HAS_ZEROS: tl.constexpr):
    """(a_even, b_even, a_odd, b_odd) with fma(v, a, b) = (q - zero) * scale for the nibbles of
    ``_nibble``: a = scale * 2**e, b = -(2**e + zero) * scale. Exact for 16-bit scales (at most
    12 + 11 significant bits in any product), so the fma rounds nothing either."""
    sc = tl.load(s_ptrs).to(tl.float32)
    if HAS_ZEROS:
        z = tl.load(z_ptrs).to(tl.float32)
    else:
        z = 8.0
    return sc * 2048.0, -(2048.0 + z) * sc, sc * 128.0, -(128.0 + z) * sc


@triton.jit
def _tile_products(acc, p, s_ptrs, z_ptrs, x_ptrs, x_mask, one_bits, HAS_ZEROS: tl.constexpr,
                   USE_DOT: tl.constexpr):
    """acc += the products of one tile: p the packed words ([BN, 1, BW] on CUDA cores, [BN, BW]
    for tl.dot), x_ptrs [BM, BW] the activations of nibble 0 of each word."""
    a0, b0, a1, b1 = _scale_terms(s_ptrs, z_ptrs, HAS_ZEROS)
    for j in tl.static_range(8):
        v = _nibble(p, one_bits, j)
        if j % 2 == 0:
            w = tl.fma(v, tl.broadcast_to(a0, v.shape), tl.broadcast_to(b0, v.shape))
        else:
            w = tl.fma(v, tl.broadcast_to(a1, v.shape), tl.broadcast_to(b1, v.shape))
        x = tl.load(x_ptrs + j, mask=x_mask, other=0.0)
        if USE_DOT:
            acc = tl.dot(w.to(x.dtype), tl.trans(x), acc, input_precision="ieee")
        else:
            acc += w * x.to(tl.float32)[None, :, :]      # [BN, 1, BW] * [1, BM, BW]
    return acc


@triton.jit
def _w4a16_gemv_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, bias_ptr, y_ptr, partial_ptr, count_ptr,
                       M, N, K, words, groups, one_bits, GROUP: tl.constexpr,
                       HAS_ZEROS: tl.constexpr,
                       HAS_BIAS: tl.constexpr, GATED: tl.constexpr, USE_DOT: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, NUM_STAGES: tl.constexpr,
                       PDL: tl.constexpr):
    """y[m, n] = sum_k x[m, k] dequant(w)[n, k]; program (i, s) owns BLOCK_N features and the
    s-th of SPLIT_K runs of K chunks. GATED: 2N weight rows and
    y = silu(x @ w[:N]^T) * (x @ w[N:]^T).

    Tiles are BLOCK_K / 8 packed words of each row; nibble j of word w meets x[:, 8w + j]. On
    CUDA cores everything is 3-D, [BLOCK_N, BLOCK_M, BLOCK_K / 8], loaded in that shape so the
    broadcasts need no layout conversion, and the K axis is reduced once after the loop; with
    tl.dot, eight [BLOCK_N, BLOCK_K / 8] x [BLOCK_K / 8, BLOCK_M] products per tile."""
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
        acc = tl.zeros((BLOCK_N, BLOCK_M, BW), dtype=tl.float32)
    acc_up = tl.zeros_like(acc)
    q_gate = qw_ptr + r * words + wo
    q_up = qw_ptr + (r + N) * words + wo
    # x[m, 8w] as [BLOCK_M, BW] in both paths: loaded once per thread and word, whatever the
    # number of rows a thread holds (broadcast as [None, :, :] on CUDA cores)
    x_base = x_ptr + offs_m[:, None] * K + (offs_w * 8)[None, :]
    m_mask = offs_m[:, None] < M

    k_start, k_end = split_k_range(pid_k, K, BLOCK_K, SPLIT_K)
    wait_for_previous_grid(PDL)
    for k in tl.range(k_start, k_end, BLOCK_K, num_stages=NUM_STAGES):
        w_mask = wo < words - k // 8
        if ONE_GROUP:    # the tile lies in one group of each row: one scale per row
            g = r * groups + k // GROUP
        else:            # masked words past K would name a group past the last: clamp
            g = r * groups + tl.minimum((k + wo * 8) // GROUP, groups - 1)
        if EVEN_K:       # no masks on the weights: 16-byte loads
            x_mask = m_mask
            p = tl.load(q_gate + k // 8)
        else:
            x_mask = m_mask & (offs_w < words - k // 8)[None, :]
            p = tl.load(q_gate + k // 8, mask=w_mask, other=0)
        acc = _tile_products(acc, p, s_ptr + g, z_ptr + g, x_base + k, x_mask, one_bits,
                             HAS_ZEROS, USE_DOT)
        if GATED:
            if EVEN_K:
                p2 = tl.load(q_up + k // 8)
            else:
                p2 = tl.load(q_up + k // 8, mask=w_mask, other=0)
            g2 = g + N * groups
            acc_up = _tile_products(acc_up, p2, s_ptr + g2, z_ptr + g2, x_base + k, x_mask,
                                    one_bits, HAS_ZEROS, USE_DOT)
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
    if not 1 <= m <= MAX_ROWS:
        return False
    n = qweight.shape[0] // 2 if gated else qweight.shape[0]
    if gated and (qweight.shape[0] % 2 or bias is not None):
        return False
    key = _tuned_key(m, n, k, group, gated)
    return key not in TUNED or TUNED[key] is not None


def _launch(x, qweight, scales, zeros, group, bias, n, gated, config):
    k = x.shape[-1]
    x2 = as_rows(x, k, MAX_ROWS)
    m = x2.shape[0]
    cfg = config or select_config(m, n, k, group, gated)
    assert cfg.block_k % 8 == 0 and cfg.block_k >= 16
    assert not cfg.dot or (cfg.block_k >= 128 and cfg.block_n >= 16), "tl.dot tiles are >= 16"
    y, tiles, partials, counts = launch_buffers(x, m, n, cfg, gated)
    block_m = max(DOT_MIN_ROWS, triton.next_power_of_2(m)) if cfg.dot \
        else triton.next_power_of_2(m)
    _w4a16_gemv_kernel[(tiles, cfg.split_k)](
        x2, qweight, scales, zeros if zeros is not None else scales,
        bias if bias is not None else scales, y, partials, counts, m, n, k, k // 8, k // group,
        ONE_BITS,
        GROUP=group, HAS_ZEROS=zeros is not None, HAS_BIAS=bias is not None, GATED=gated,
        USE_DOT=cfg.dot, BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        SPLIT_K=cfg.split_k, EVEN_K=k % cfg.block_k == 0, NUM_STAGES=cfg.num_stages,
        num_warps=cfg.num_warps,
        **pdl.launch_options(x.device))
    return y.view(*x.shape[:-1], n)


def w4a16_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
               zeros: torch.Tensor | None, group: int, bias: torch.Tensor | None = None,
               config: GemvConfig | None = None) -> torch.Tensor:
    """x [..., K] (<= MAX_ROWS rows), qweight int32 [N, K / 8], scales [N, K / group], zeros
    uint8 [N, K / group] or None (symmetric: 8) -> [..., N] in x's dtype."""
    return _launch(x, qweight, scales, zeros, group, bias, qweight.shape[0], False, config)


def w4a16_gated_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                     zeros: torch.Tensor | None, group: int,
                     config: GemvConfig | None = None) -> torch.Tensor:
    """silu(x @ gate^T) * (x @ up^T) for a packed [gate; up] weight of 2I rows -> [..., I]."""
    assert qweight.shape[0] % 2 == 0
    return _launch(x, qweight, scales, zeros, group, None, qweight.shape[0] // 2, True, config)
