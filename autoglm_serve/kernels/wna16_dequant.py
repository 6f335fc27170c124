"""Packed int4 / int8 weights dequantized to 16 bits on the GPU, for cuBLAS at prefill.

Above a few rows a W4A16 GEMM is bound by compute, not by weight bytes, and our tile-by-tile
dequantizing kernel (kernels/wna16.py) ran it ~8x slower than cuBLAS on bf16 weights (gate_up at
2,048 rows on the H200: 4.5 ms against 0.56 ms, scripts/gpu/quant_gemv_bench.py). Writing the
16-bit weight once per call costs a read of the packed weight and a write of the 16-bit one
(~0.3 GB for gate_up: ~70 us at the H200's bandwidth), then cuBLAS runs at its own speed.
Decode steps of more than 16 rows take this path too (quantization/wna16.py), so its speed is
W4A16's offline throughput: reading each program's words once, in rows of consecutive words,
took gate_up from 699 to 107 us on an H100 (2.6 TB/s) and offline output from 0.46x to 0.83x
bf16's (BENCHMARKS.md).

One scratch buffer per (device, dtype) holds the dequantized weight, sized by the largest layer
seen; layers run one after another on one stream, so they share it. The start-up profile's
forward reaches every layer before the KV cache is sized and before CUDA graphs are captured,
so the buffer is counted in the memory plan and never grows inside a capture.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

_scratch: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
# a program's tile: each row's 256 weights are 128 bytes of consecutive int4 words
BLOCK_N, BLOCK_K = 16, 256


# How a tile finds its scales (and zero points): one a row when no tile straddles a group
# (TILE_GROUP: the group a multiple of BLOCK_K, or the whole row), a row of them broadcast over
# whole groups (TILE_GROUPS: BLOCK_K a multiple of the group), else one load per weight.
TILE_GROUP, TILE_GROUPS, PER_WEIGHT = 0, 1, 2


@triton.jit
def _dequant_kernel(qw_ptr, s_ptr, z_ptr, out_ptr, N, K, stride_qn, stride_sn, stride_on,
                    GROUP: tl.constexpr, BITS: tl.constexpr, HAS_ZEROS: tl.constexpr,
                    SCALES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Each program reads its [BLOCK_N, BLOCK_K / PF] words once, in rows of consecutive words,
    and unpacks them in registers; a load of a word and a scale for each weight had cost 3-7x
    the bytes' time."""
    PF: tl.constexpr = 32 // BITS
    WORDS: tl.constexpr = BLOCK_K // PF
    MASK: tl.constexpr = (1 << BITS) - 1
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    words_at = k0 // PF + tl.arange(0, WORDS)
    rows64 = rows.to(tl.int64)[:, None]
    row_mask = rows[:, None] < N
    words = tl.load(qw_ptr + rows64 * stride_qn + words_at[None, :],
                    mask=row_mask & (words_at[None, :] < K // PF), other=0)
    shifts = tl.arange(0, PF) * BITS
    q = tl.reshape((words[:, :, None] >> shifts[None, None, :]) & MASK, (BLOCK_N, BLOCK_K))
    cols = k0 + tl.arange(0, BLOCK_K)
    mask = row_mask & (cols[None, :] < K)
    if SCALES == 0:      # TILE_GROUP
        scale_at = rows64 * stride_sn + k0 // GROUP
        scale = tl.load(s_ptr + scale_at, mask=row_mask, other=0.0).to(tl.float32)
        zero = tl.load(z_ptr + scale_at, mask=row_mask, other=0).to(tl.float32) if HAS_ZEROS \
            else (1 << (BITS - 1)) * 1.0
        w = (q.to(tl.float32) - zero) * scale
    elif SCALES == 1:    # TILE_GROUPS
        GROUPS: tl.constexpr = BLOCK_K // GROUP
        groups = k0 // GROUP + tl.arange(0, GROUPS)
        scale_at = rows64 * stride_sn + groups[None, :]
        group_mask = row_mask & (groups[None, :] < K // GROUP)
        scale = tl.load(s_ptr + scale_at, mask=group_mask, other=0.0).to(tl.float32)
        if HAS_ZEROS:
            zero = tl.load(z_ptr + scale_at, mask=group_mask, other=0).to(tl.float32)
        else:
            zero = tl.full((BLOCK_N, GROUPS), (1 << (BITS - 1)) * 1.0, tl.float32)
        by_group = tl.reshape(q.to(tl.float32), (BLOCK_N, GROUPS, GROUP))
        w = tl.reshape((by_group - zero[:, :, None]) * scale[:, :, None], (BLOCK_N, BLOCK_K))
    else:                # PER_WEIGHT
        scale_at = rows64 * stride_sn + (cols // GROUP)[None, :]
        scale = tl.load(s_ptr + scale_at, mask=mask, other=0.0).to(tl.float32)
        zero = tl.load(z_ptr + scale_at, mask=mask, other=0).to(tl.float32) if HAS_ZEROS \
            else (1 << (BITS - 1)) * 1.0
        w = (q.to(tl.float32) - zero) * scale
    tl.store(out_ptr + rows64 * stride_on + cols[None, :], w.to(out_ptr.dtype.element_ty),
             mask=mask)


def _scales_layout(group: int, k: int, block_k: int) -> int:
    if group % block_k == 0 or group == k:
        return TILE_GROUP
    if block_k % group == 0 and _is_power_of_2(group):
        return TILE_GROUPS
    return PER_WEIGHT


def _is_power_of_2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def dequantize(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
               bits: int, group: int, dtype: torch.dtype) -> torch.Tensor:
    """[N, K] weight in ``dtype`` (a view of the shared scratch buffer, valid until the next
    call on this device and dtype) from our packed layout (quantization/packing.py)."""
    n = qweight.shape[0]
    k = qweight.shape[1] * (32 // bits)
    key = (qweight.device, dtype)
    buf = _scratch.get(key)
    if buf is None or buf.numel() < n * k:
        del buf
        _scratch.pop(key, None)     # free the smaller one before taking the larger
        buf = _scratch[key] = torch.empty(n * k, device=qweight.device, dtype=dtype)
    out = buf[:n * k].view(n, k)
    grid = (triton.cdiv(n, BLOCK_N), triton.cdiv(k, BLOCK_K))
    _dequant_kernel[grid](qweight, scales, zeros if zeros is not None else scales, out, n, k,
                          qweight.stride(0), scales.stride(0), out.stride(0), GROUP=group,
                          BITS=bits, HAS_ZEROS=zeros is not None,
                          SCALES=_scales_layout(group, k, BLOCK_K), BLOCK_N=BLOCK_N,
                          BLOCK_K=BLOCK_K)
    return out
