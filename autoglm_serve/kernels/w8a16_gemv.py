"""Decode GEMV for int8 weights with 16-bit activations (W8A16): y = x @ dequant(W)^T (+ bias)
for 1..MAX_ROWS activation rows, and up to WIDE_MAX_ROWS where TUNED has a config for the rows
(as the 4-bit GEMV: there the alternative dequantizes the whole weight for cuBLAS). These are
the Linears `quantize --int8-targets` keeps at 8 bits (every down_proj, say) inside an int4
checkpoint; without this kernel they took the prefill GEMM (kernels/wna16.py) at decode, which at 4 bits is 3.6-7.6x slower than the 4-bit GEMV at
AutoGLM's shapes (w4a16_gemv.TUNED's comments: down_proj 114 against 15 us at one row, 108
against 30 at 4-16 rows).

The weight is our packed layout (quantization/packing.py): int32 words along K, byte j of a word
is input channel 4w + j, one scale (and optionally a uint8 zero) per group of input channels.
It is kernels/w4a16_gemv.py's design with four bytes a word in place of eight nibbles, and
without that kernel's bf16-pair path (a byte does not fit a bf16's mantissa):

- a program loads BLOCK_K / 4 contiguous words of each of its rows and takes the 4 bytes of
  every word in turn, byte j against x[4w + j];
- a byte becomes the float 256 + q with no int-to-float conversion: shifted to mantissa bits
  15..22 under the exponent of 256 with one and-or (``_integer_byte``);
- CUDA cores (``dot=False``, any rows): the group's scale and zero factored out of each word's
  sum, s * (sum_j x_j (256 + q_j) - (256 + z) sum_j x_j), so a weight costs a shift, its LOP3
  and one fma; products accumulated elementwise in fp32 and reduced across K once at the end;
- ``dot=True`` (2..WIDE_MAX_ROWS rows): one tensor-core product a tile of the exact integers
  q - z in x's dtype (|q - z| <= 255: exact in bf16), the bytes interleaved back into K order,
  scaled after it when the tile lies in one group, else each weight scaled first.

Split-K, its deterministic last-program reduction, the gated variant (gate_up followed by
SiLU-and-mul) and PDL are kernels/gemv.py's. ``TUNED`` is keyed (kind, rows bucket, N, K, group),
None meaning the prefill kernel runs; it is empty until measured on the GPU
(scripts/gpu/int8_linears_bench.py), so ``default_config`` decides.
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
                                        default_split_k, f16_lanes, finish_split_k,
                                        launch_buffers, rows_bucket, split_k_range)
from autoglm_serve.kernels.pdl import let_dependents_launch, wait_for_previous_grid
from autoglm_serve.kernels.w4a16_gemv import group_params

ENABLED = True
MAX_ROWS = 16           # the decode CUDA graphs' batch sizes 1, 2, 4, 8, 16
WIDE_MAX_ROWS = 64      # 17..64 rows (decode batches of 32, 48, 64): only where TUNED says
DOT_MIN_ROWS = 16       # tl.dot's smallest tile side for 16-bit operands
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# the exponent bits of 256.0, an argument so it sits in a register: ptxas then merges a byte's
# and-mask and this or into one LOP3 (see ``_integer_byte``)
BYTE_EXP = 0x43800000

# (kind, rows bucket, N, K, group) -> config (or None: kernels/wna16.py). Not yet measured.
TUNED: dict[tuple[str, int, int, int, int], GemvConfig | None] = {}


def default_config(m: int, n: int, k: int, group: int) -> GemvConfig:
    """Untuned: tiles of 64 rows x 128 channels (8 KB of weights, as the 4-bit GEMV's 128 x 128),
    split-K up to ~256 programs; one row on CUDA cores, more on tensor cores."""
    block_n, block_k = 64, 128
    split_k = default_split_k(triton.cdiv(n, block_n), triton.cdiv(k, block_k), 4)
    return GemvConfig(block_n, block_k, split_k, num_warps=4, num_stages=3, dot=m > 1)


def _tuned_key(m, n, k, group, gated):
    return ("gated" if gated else "linear", rows_bucket(m), n, k, group)


def select_config(m: int, n: int, k: int, group: int, gated: bool = False) -> GemvConfig:
    return TUNED.get(_tuned_key(m, n, k, group, gated)) or default_config(m, n, k, group)


@triton.jit
def _integer_byte(p, byte_exp, J: tl.constexpr):
    """Byte J of each packed word as the float 256 + q, exactly: the byte moved to mantissa bits
    15..22 under the exponent of 256, one and-or (LOP3; the exponent is an argument, in a
    register). Arithmetic shifts of p only fill bits the mask drops."""
    if J == 0:
        moved = p << 15
    elif J == 1:
        moved = p << 7
    elif J == 2:
        moved = p >> 1
    else:
        moved = p >> 9
    return ((moved & 0x7F8000) | byte_exp).to(tl.float32, bitcast=True)


@triton.jit
def _x_values(x_ptrs, x_mask, X_PAIRS: tl.constexpr):
    """The 4 activations of each word as fp32 [BM, BW] tensors and their sum. X_PAIRS: x is
    16-bit, read as int32 pairs (2 loads a word; X_PAIRS 1 bf16, 2 fp16)."""
    if X_PAIRS:
        x01 = tl.load(x_ptrs, mask=x_mask, other=0).to(tl.uint32, bitcast=True)
        x23 = tl.load(x_ptrs + 1, mask=x_mask, other=0).to(tl.uint32, bitcast=True)
        if X_PAIRS == 1:
            x0, x1 = bf16_lanes(x01)
            x2, x3 = bf16_lanes(x23)
        else:
            x0, x1 = f16_lanes(x01)
            x2, x3 = f16_lanes(x23)
    else:
        x0 = tl.load(x_ptrs, mask=x_mask, other=0.0)
        x1 = tl.load(x_ptrs + 1, mask=x_mask, other=0.0)
        x2 = tl.load(x_ptrs + 2, mask=x_mask, other=0.0)
        x3 = tl.load(x_ptrs + 3, mask=x_mask, other=0.0)
    return x0, x1, x2, x3, (x0 + x1) + (x2 + x3)


@triton.jit
def _tile_cuda_cores(acc, p, sc, z, xs, byte_exp, HAS_ZEROS: tl.constexpr):
    """acc [BN, BM, BW] += one tile's products on CUDA cores: p the packed words [BN, 1, BW],
    sc and z the groups' scales and zeros, xs ``_x_values`` ([BM, BW] each). With
    v_j = 256 + q_j, sum_j x_j (q_j - z) s = s (sum_j x_j v_j - (256 + z) total)."""
    x0, x1, x2, x3, total = xs
    if HAS_ZEROS:
        t = -(z + 256.0) * total[None, :, :]
    else:          # symmetric: the zero 128
        t = tl.zeros_like(acc) - 384.0 * total[None, :, :]
    t = tl.fma(_integer_byte(p, byte_exp, 0), x0[None, :, :], t)
    t = tl.fma(_integer_byte(p, byte_exp, 1), x1[None, :, :], t)
    t = tl.fma(_integer_byte(p, byte_exp, 2), x2[None, :, :], t)
    t = tl.fma(_integer_byte(p, byte_exp, 3), x3[None, :, :], t)
    return tl.fma(t, sc, acc)


@triton.jit
def _byte_weights(p, J: tl.constexpr, zero, sc, byte_exp, dtype: tl.constexpr,
                  ONE_GROUP: tl.constexpr):
    """Byte J of each word as the MMA's weight in x's dtype: q - z (exact), or (q - z) * scale
    rounded once where the tile spans several groups."""
    w = _integer_byte(p, byte_exp, J) - zero
    if not ONE_GROUP:
        w = w * sc
    return w.to(dtype)


@triton.jit
def _tile_dot(acc, p, sc, z, x_ptrs, x_mask, byte_exp, HAS_ZEROS: tl.constexpr,
              ONE_GROUP: tl.constexpr):
    """acc [BN, BM] += the tensor-core product of one tile: p the packed words [BN, BW], x_ptrs
    [BM, BK] the tile's activations in K order."""
    dtype: tl.constexpr = x_ptrs.dtype.element_ty
    if not HAS_ZEROS:
        z = 128.0
    zero = z + 256.0
    b0 = _byte_weights(p, 0, zero, sc, byte_exp, dtype, ONE_GROUP)
    b1 = _byte_weights(p, 1, zero, sc, byte_exp, dtype, ONE_GROUP)
    b2 = _byte_weights(p, 2, zero, sc, byte_exp, dtype, ONE_GROUP)
    b3 = _byte_weights(p, 3, zero, sc, byte_exp, dtype, ONE_GROUP)
    # each join adds a minor axis: the inner pairs bytes 2 apart, the outer adjacent ones, so
    # the [BN, BW, 2, 2] tile read in order is byte j of word w at 4w + j
    w = tl.join(tl.join(b0, b2), tl.join(b1, b3))
    w = tl.reshape(w, (w.shape[0], w.shape[1] * 4))
    x = tl.load(x_ptrs, mask=x_mask, other=0.0)
    tile = tl.dot(w, tl.trans(x), tl.zeros_like(acc), input_precision="ieee")
    if ONE_GROUP:
        return tl.fma(tile, sc, acc)
    return acc + tile


@triton.jit
def _group_offsets(r, wo, k, groups, GROUP: tl.constexpr, ONE_GROUP: tl.constexpr):
    """Offsets into scales and zeros of the groups the tile at K offset k lies in: one a row
    when ONE_GROUP, else one a word (clamped: masked words past K would name a group past the
    last)."""
    if ONE_GROUP:
        g = r * groups + k // GROUP
    else:
        g = r * groups + tl.minimum((k + wo * 4) // GROUP, groups - 1)
    return g


@triton.jit
def _w8a16_gemv_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, bias_ptr, y_ptr, partial_ptr, count_ptr,
                       M, N, K, x_stride, words, groups, byte_exp,
                       GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, X_PAIRS: tl.constexpr,
                       HAS_BIAS: tl.constexpr, GATED: tl.constexpr, USE_DOT: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, NUM_STAGES: tl.constexpr,
                       COMPILED: tl.constexpr, PDL: tl.constexpr):
    """y[m, n] = sum_k x[m, k] dequant(w)[n, k]; program (i, s) owns BLOCK_N features and the
    s-th of SPLIT_K runs of K chunks. GATED: 2N weight rows and
    y = silu(x @ w[:N]^T) * (x @ w[N:]^T). On CUDA cores the tiles are 3-D,
    [BLOCK_N, BLOCK_M, BLOCK_K / 4], reduced across K after the loop; with tl.dot one
    [BLOCK_N, BLOCK_K] x [BLOCK_K, BLOCK_M] product a tile."""
    BW: tl.constexpr = BLOCK_K // 4
    ONE_GROUP: tl.constexpr = GROUP % BLOCK_K == 0
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(offs_n, N - 1).to(tl.int64)   # rows past N re-read row N - 1, dropped
    offs_m = tl.arange(0, BLOCK_M)
    offs_w = tl.arange(0, BW)
    # words (K / 4) and groups (K / GROUP) are arguments so Triton sees the packed row stride's
    # divisibility by 16 and issues 16-byte weight loads
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
    m_mask = offs_m[:, None] < M
    if USE_DOT:      # x [BLOCK_M, BLOCK_K] in K order
        offs_k = tl.arange(0, BLOCK_K)
        x_base = x_ptr + offs_m[:, None] * x_stride + offs_k[None, :]
    else:            # x[m, 4w] as [BLOCK_M, BW] (X_PAIRS: int32 pairs, 2 a word)
        x_base = x_ptr + offs_m[:, None] * x_stride + (offs_w * (2 if X_PAIRS else 4))[None, :]

    k_start, k_end = split_k_range(pid_k, K, BLOCK_K, SPLIT_K)
    # scales and zeros a tile ahead of their use, as in the 4-bit GEMV (w4a16_gemv.py says why);
    # weights, which no kernel writes, so the first tile's go before the wait
    up = N * groups
    g = _group_offsets(r, wo, tl.minimum(k_start, k_end - 1), groups, GROUP, ONE_GROUP)
    sc, z = group_params(s_ptr + g, z_ptr + g, HAS_ZEROS, COMPILED)
    sc_up, z_up = sc, z
    if GATED:
        sc_up, z_up = group_params(s_ptr + up + g, z_ptr + up + g, HAS_ZEROS, COMPILED)
    wait_for_previous_grid(PDL)
    for k in tl.range(k_start, k_end, BLOCK_K, num_stages=NUM_STAGES):
        g = _group_offsets(r, wo, tl.minimum(k + BLOCK_K, k_end - 1), groups, GROUP,
                           ONE_GROUP)
        sc_next, z_next = group_params(s_ptr + g, z_ptr + g, HAS_ZEROS, COMPILED)
        sc_up_next, z_up_next = sc_next, z_next
        if GATED:
            sc_up_next, z_up_next = group_params(s_ptr + up + g, z_ptr + up + g, HAS_ZEROS,
                                                  COMPILED)
        w_mask = wo < words - k // 4
        if EVEN_K:       # no masks on the weights: 16-byte loads
            x_mask = m_mask
            p = tl.load(q_gate + k // 4)
        else:
            if USE_DOT:
                x_mask = m_mask & (offs_k < K - k)[None, :]
            else:
                x_mask = m_mask & (offs_w < words - k // 4)[None, :]
            p = tl.load(q_gate + k // 4, mask=w_mask, other=0)
        x_tile = x_base + (k // 2 if X_PAIRS else k)
        if USE_DOT:
            acc = _tile_dot(acc, p, sc, z, x_tile, x_mask, byte_exp, HAS_ZEROS, ONE_GROUP)
        else:
            xs = _x_values(x_tile, x_mask, X_PAIRS)
            acc = _tile_cuda_cores(acc, p, sc, z, xs, byte_exp, HAS_ZEROS)
        if GATED:
            if EVEN_K:
                p2 = tl.load(q_up + k // 4)
            else:
                p2 = tl.load(q_up + k // 4, mask=w_mask, other=0)
            if USE_DOT:
                acc_up = _tile_dot(acc_up, p2, sc_up, z_up, x_tile, x_mask, byte_exp, HAS_ZEROS,
                                   ONE_GROUP)
            else:
                acc_up = _tile_cuda_cores(acc_up, p2, sc_up, z_up, xs, byte_exp, HAS_ZEROS)
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
    """Whether the GEMV handles this call (and is not slower than kernels/wna16.py where
    measured)."""
    if not ENABLED or bits != 8 or x.dtype not in DTYPES or not x.is_cuda:
        return False
    k = x.shape[-1]
    if k == 0 or qweight.shape[1] * 4 != k or k % group or group % 4:
        return False
    if not (qweight.is_contiguous() and scales.is_contiguous()):
        return False
    m = x.numel() // k
    if not 1 <= m <= WIDE_MAX_ROWS:
        return False
    if gated and (qweight.shape[0] % 2 or bias is not None):
        return False
    n = qweight.shape[0] // 2 if gated else qweight.shape[0]
    key = _tuned_key(m, n, k, group, gated)
    if m > MAX_ROWS:     # measured against dequantize-then-cuBLAS, or not taken
        return TUNED.get(key) is not None
    return key not in TUNED or TUNED[key] is not None


def _launch(x, qweight, scales, zeros, group, bias, n, gated, config):
    k = x.shape[-1]
    x2 = as_rows(x, k, WIDE_MAX_ROWS)
    m = x2.shape[0]
    cfg = config or select_config(m, n, k, group, gated)
    assert cfg.block_k % 4 == 0 and cfg.block_k >= 16
    assert not cfg.dot or (cfg.block_k >= 64 and cfg.block_n >= 16), "tl.dot tiles are >= 16"
    # split-K partials for the rows bucket (a workspace of 16 rows would be overrun at 32-64)
    y, tiles, partials, counts = launch_buffers(x, m, n, cfg, gated,
                                                max(MAX_ROWS, rows_bucket(m)))
    block_m = max(DOT_MIN_ROWS, next_power_of_2(m)) if cfg.dot else next_power_of_2(m)
    pairs = 0 if cfg.dot or x.dtype == torch.float32 else (1 if x.dtype == torch.bfloat16 else 2)
    _w8a16_gemv_kernel[(tiles, cfg.split_k)](
        as_int32_pairs(x2) if pairs else x2, qweight, scales,
        zeros if zeros is not None else scales, bias if bias is not None else scales, y,
        partials, counts, m, n, k, k // 2 if pairs else k, k // 4, k // group, BYTE_EXP,
        GROUP=group, HAS_ZEROS=zeros is not None, X_PAIRS=pairs, HAS_BIAS=bias is not None,
        GATED=gated, USE_DOT=cfg.dot, BLOCK_M=block_m, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k, EVEN_K=k % cfg.block_k == 0,
        NUM_STAGES=cfg.num_stages, COMPILED=os.environ.get("TRITON_INTERPRET") != "1",
        num_warps=cfg.num_warps, **pdl.launch_options(x.device))
    return y.view(*x.shape[:-1], n)


def w8a16_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
               zeros: torch.Tensor | None, group: int, bias: torch.Tensor | None = None,
               config: GemvConfig | None = None) -> torch.Tensor:
    """x [..., K] (<= WIDE_MAX_ROWS rows), qweight int32 [N, K / 4], scales [N, K / group],
    zeros uint8 [N, K / group] or None (symmetric: 128) -> [..., N] in x's dtype."""
    return _launch(x, qweight, scales, zeros, group, bias, qweight.shape[0], False, config)


def w8a16_gated_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                     zeros: torch.Tensor | None, group: int,
                     config: GemvConfig | None = None) -> torch.Tensor:
    """silu(x @ gate^T) * (x @ up^T) for a packed [gate; up] weight of 2I rows -> [..., I]."""
    assert qweight.shape[0] % 2 == 0
    return _launch(x, qweight, scales, zeros, group, None, qweight.shape[0] // 2, True, config)
