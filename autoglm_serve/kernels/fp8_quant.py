"""Per-token FP8 activation quantization in one kernel, for the GEMM path (more rows than the
FP8 GEMV takes): x [M, K] -> (e4m3 [M, K], fp32 scale [M, 1]) with the codes and scales of
quantization/fp8.quantize_rows (kernels/fp8_rows.py), whose four torch ops (abs-amax, divide,
clamp, cast) each read or write the whole activation.

One program per row: a pass for the amax, then a pass that writes the quantized row (the second
read of the row comes from L2); the rows after GLM-4's norm pairs come quantized from the norm
(kernels/fused_ops.py) and skip this. down_proj's input is quantized as SiLU-and-mul computes
it (``silu_and_mul_quantize``): the [gate | up] rows read once where a row fits in registers
(AutoGLM's 13,696 columns), else twice, where the two kernels read them, wrote the product in
16 bits and read that twice. No host syncs, fixed shapes: CUDA-graph safe.

``ENABLED``: quantization/kernel_checks.py sets it False where a kernel fails or disagrees with
the torch ops at start-up (they then run, and the norms write no codes).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from autoglm_serve.kernels import next_power_of_2, pdl
from autoglm_serve.kernels.fp8_rows import FP8, row_codes, row_scale
from autoglm_serve.kernels.fused_ops import silu_mul
from autoglm_serve.kernels.pdl import wait_for_previous_grid

ENABLED = True
ONE_TILE_MAX = 16384       # columns of SiLU-and-mul's product held in registers


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, BLOCK_K: tl.constexpr,
                          PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    x_row = x_ptr + row * stride_x
    wait_for_previous_grid(PDL)
    amax = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        x = tl.load(x_row + k + offs, mask=offs < K - k, other=0.0)
        amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
    scale = row_scale(tl.max(amax, axis=0))
    tl.store(s_ptr + row, scale)
    for k in range(0, K, BLOCK_K):
        mask = offs < K - k
        x = tl.load(x_row + k + offs, mask=mask, other=0.0)
        tl.store(q_ptr + row * K + k + offs, row_codes(x, scale), mask=mask)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] 16/32-bit -> (e4m3 [M, K], float32 scale [M, 1])."""
    m, k = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    q = torch.empty(m, k, dtype=FP8, device=x.device)
    scale = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    if m:
        block_k = min(2048, next_power_of_2(k))
        _quantize_rows_kernel[(m,)](x, q, scale, k, x.stride(0), BLOCK_K=block_k,
                                    num_warps=4 if block_k >= 1024 else 1,
                                    **pdl.launch_options(x.device))
    return q, scale


@triton.jit
def _silu_and_mul_quantize_kernel(x_ptr, q_ptr, s_ptr, D, stride_x, BLOCK: tl.constexpr,
                                  ONE_TILE: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    gate_row = x_ptr + row * stride_x
    wait_for_previous_grid(PDL)
    if ONE_TILE:    # BLOCK >= D: the row stays in registers, read once
        mask = offs < D         # masked columns: silu(0) * 0 = 0, no effect on the amax
        act = silu_mul(tl.load(gate_row + offs, mask=mask, other=0.0),
                       tl.load(gate_row + D + offs, mask=mask, other=0.0)).to(tl.float32)
        scale = row_scale(tl.max(tl.abs(act), axis=0))
        tl.store(s_ptr + row, scale)
        tl.store(q_ptr + row * D + offs, row_codes(act, scale), mask=mask)
    else:           # a pass for the amax, then one that writes (its reads mostly from L2)
        amax = tl.zeros((BLOCK,), dtype=tl.float32)
        for k in range(0, D, BLOCK):
            mask = offs < D - k
            act = silu_mul(tl.load(gate_row + k + offs, mask=mask, other=0.0),
                           tl.load(gate_row + D + k + offs, mask=mask, other=0.0))
            amax = tl.maximum(amax, tl.abs(act.to(tl.float32)))
        scale = row_scale(tl.max(amax, axis=0))
        tl.store(s_ptr + row, scale)
        for k in range(0, D, BLOCK):
            mask = offs < D - k
            act = silu_mul(tl.load(gate_row + k + offs, mask=mask, other=0.0),
                           tl.load(gate_row + D + k + offs, mask=mask, other=0.0))
            tl.store(q_ptr + row * D + k + offs, row_codes(act, scale), mask=mask)


def silu_and_mul_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, 2D] rows of [gate | up] (16/32-bit) -> (e4m3 [M, D], float32 scale [M, 1]): bit for
    bit ``quantize_rows(fused_ops.silu_and_mul(x))``, without the product in memory."""
    m, d2 = x.shape
    d = d2 // 2
    if x.stride(-1) != 1:
        x = x.contiguous()
    q = torch.empty(m, d, dtype=FP8, device=x.device)
    scale = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    if m:
        # one program a row. Up to ONE_TILE_MAX columns the whole row sits in registers (16
        # elements of gate and of up a thread at 32 warps), so it is read once: H100, d =
        # 13,696, 16 / 256 / 4,096 / 16,384 rows: 6.4 / 10.8 / 123.7 / 485.0 us, where two
        # passes over 8,192-column tiles took 9.1 / 14.2 / 161.1 / 610.1 (BENCHMARKS.md)
        one_tile = d <= ONE_TILE_MAX
        block = next_power_of_2(d) if one_tile else 8192
        num_warps = max(1, min(32, block // 512))
        _silu_and_mul_quantize_kernel[(m,)](x, q, scale, d, x.stride(0), BLOCK=block,
                                            ONE_TILE=one_tile, num_warps=num_warps,
                                            **pdl.launch_options(x.device))
    return q, scale
