"""Int4 / int8 weights with 16-bit activations (W4A16, W8A16): y = x @ dequant(W)^T (+ bias).

The weight stays packed in memory (quantization/packing.py: 32 / bits unsigned values per int32
along K) and is dequantized tile by tile in registers, w = (q - zero) * scale with one scale (and
zero) per group of ``group`` input channels, then multiplied on tensor cores with fp32
accumulation. Decode reads 4x fewer weight bytes than bf16, which is what bounds it.

One kernel, two launch shapes: ``BLOCK_M`` 16 for decode (1..16 rows: tl.dot's smallest tile,
the padding is free in a bandwidth-bound GEMV) with narrow, deep tiles, and 64/128-row tiles for
prefill. A K tile inside one group loads one scale (and zero) per output row; a tile of whole
groups loads one per group and broadcasts it; anything else gathers one per element.

Launch parameters depend only on (M, N, K, group, bits, dtype) and the output is allocated from
x's shape: no host syncs, so the launches are captured by the decode CUDA graphs.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl


class WNA16Config(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3


# (M bucket, N, K, group) -> config, measured on the H200 by scripts/gpu/quant_bench.py
TUNED: dict[tuple[int, int, int, int], WNA16Config] = {}


def select_config(m: int, n: int, k: int, group: int) -> WNA16Config:
    tuned = TUNED.get((16 if m <= 16 else m, n, k, group))
    if tuned is not None:
        return tuned
    block_k = 128 if group % 128 == 0 else (64 if group % 64 == 0 else 32)
    if m <= 16:
        # decode: narrow, deep tiles so ~4 KB of each program's weights are in flight per
        # stage and N = 4096 still makes 256 programs (bandwidth needs bytes in flight)
        return WNA16Config(16, 16, 512 if group <= 512 and 512 % group == 0 else block_k, 4, 3)
    if m <= 64:
        return WNA16Config(64, 64, min(block_k, 64), 4, 3)
    return WNA16Config(128, 128, min(block_k, 64), 8, 3)


@triton.jit
def _wna16_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, bias_ptr, y_ptr, M, N, K,
                  stride_xm, stride_qn, stride_sn, stride_ym,
                  GROUP: tl.constexpr, BITS: tl.constexpr, HAS_ZEROS: tl.constexpr,
                  HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr):
    PF: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    ONE_GROUP_PER_TILE: tl.constexpr = GROUP % BLOCK_K == 0
    WHOLE_GROUPS_PER_TILE: tl.constexpr = BLOCK_K % GROUP == 0
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(offs_n, N - 1).to(tl.int64)   # rows past N re-read row N - 1, dropped
    offs_k = tl.arange(0, BLOCK_K)
    offs_w = tl.arange(0, BLOCK_K // PF)
    shifts = (tl.arange(0, PF) * BITS).to(tl.int32)
    m_mask = offs_m[:, None] < M
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        k_mask = (k + offs_k) < K
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + (k + offs_k)[None, :],
                    mask=m_mask & k_mask[None, :], other=0.0)
        w_mask = ((k // PF + offs_w) < tl.cdiv(K, PF))[None, :]
        packed = tl.load(qw_ptr + rows[:, None] * stride_qn + (k // PF + offs_w)[None, :],
                         mask=w_mask, other=0)
        q = (packed[:, :, None] >> shifts[None, None, :]) & MASK
        q = tl.reshape(q, (BLOCK_N, BLOCK_K))
        if ONE_GROUP_PER_TILE:
            g = k // GROUP
            scale = tl.load(s_ptr + rows * stride_sn + g).to(tl.float32)[:, None]
            if HAS_ZEROS:
                zero = tl.load(z_ptr + rows * stride_sn + g).to(tl.float32)[:, None]
            else:
                zero = (1 << (BITS - 1)) * 1.0
        elif WHOLE_GROUPS_PER_TILE:
            # BLOCK_K // GROUP scales per row, broadcast over their groups
            g = k // GROUP + tl.arange(0, BLOCK_K // GROUP)
            g_mask = (g < tl.cdiv(K, GROUP))[None, :]
            scale = tl.load(s_ptr + rows[:, None] * stride_sn + g[None, :], mask=g_mask,
                            other=0.0).to(tl.float32)
            scale = tl.reshape(tl.broadcast_to(scale[:, :, None], (BLOCK_N, BLOCK_K // GROUP, GROUP)),
                               (BLOCK_N, BLOCK_K))
            if HAS_ZEROS:
                zero = tl.load(z_ptr + rows[:, None] * stride_sn + g[None, :], mask=g_mask,
                               other=0).to(tl.float32)
                zero = tl.reshape(tl.broadcast_to(zero[:, :, None],
                                                  (BLOCK_N, BLOCK_K // GROUP, GROUP)),
                                  (BLOCK_N, BLOCK_K))
            else:
                zero = (1 << (BITS - 1)) * 1.0
        else:
            g = tl.minimum(k + offs_k, K - 1) // GROUP
            scale = tl.load(s_ptr + rows[:, None] * stride_sn + g[None, :]).to(tl.float32)
            if HAS_ZEROS:
                zero = tl.load(z_ptr + rows[:, None] * stride_sn + g[None, :]).to(tl.float32)
            else:
                zero = (1 << (BITS - 1)) * 1.0
        w = ((q.to(tl.float32) - zero) * scale).to(x.dtype)
        w = tl.where(k_mask[None, :], w, 0.0).to(x.dtype)
        # float32 operands as float32, not TF32 (8e-4 off on an H200); 16-bit ones unaffected
        acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rows).to(tl.float32)[None, :]
    y_mask = m_mask & (offs_n[None, :] < N)
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=y_mask)


def wna16_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                 zeros: torch.Tensor | None, bits: int, group: int,
                 bias: torch.Tensor | None = None,
                 config: WNA16Config | None = None) -> torch.Tensor:
    """x [..., K] (16-bit or fp32), qweight int32 [N, K * bits / 32], scales [N, K / group],
    zeros uint8 [N, K / group] or None (symmetric: 2**(bits-1)) -> [..., N] in x's dtype."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m, k = x2.shape
    n = qweight.shape[0]
    if qweight.shape[1] * (32 // bits) != k or k % group:
        raise ValueError(f"packed weight {tuple(qweight.shape)} ({bits}-bit) does not fit "
                         f"K = {k} with group {group}")
    cfg = config or select_config(m, n, k, group)
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)
    grid = (triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n))
    _wna16_kernel[grid](x2, qweight, scales, zeros if zeros is not None else scales,
                        bias if bias is not None else scales, y, m, n, k,
                        x2.stride(0), qweight.stride(0), scales.stride(0), y.stride(0),
                        GROUP=group, BITS=bits, HAS_ZEROS=zeros is not None,
                        HAS_BIAS=bias is not None, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                        BLOCK_K=cfg.block_k, NUM_STAGES=cfg.num_stages,
                        num_warps=cfg.num_warps)
    return y.reshape(*shape[:-1], n)
