"""Packed int4 / int8 weights dequantized to 16 bits on the GPU, for cuBLAS at prefill.

Above a few rows a W4A16 GEMM is bound by compute, not by weight bytes, and our tile-by-tile
dequantizing kernel (kernels/wna16.py) ran it ~8x slower than cuBLAS on bf16 weights (gate_up at
2,048 rows on the H200: 4.5 ms against 0.56 ms, scripts/gpu/quant_gemv_bench.py). Writing the
16-bit weight once per call costs a read of the packed weight and a write of the 16-bit one
(~0.3 GB for gate_up: ~70 us at the H200's bandwidth), then cuBLAS runs at its own speed.

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


@triton.jit
def _dequant_kernel(qw_ptr, s_ptr, z_ptr, out_ptr, N, K, stride_qn, stride_sn, stride_on,
                    GROUP: tl.constexpr, BITS: tl.constexpr, HAS_ZEROS: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    PF: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (rows[:, None] < N) & (cols[None, :] < K)
    rows64 = rows.to(tl.int64)[:, None]
    words = tl.load(qw_ptr + rows64 * stride_qn + (cols // PF)[None, :], mask=mask, other=0)
    q = (words >> ((cols % PF) * BITS)[None, :]) & MASK
    groups = (cols // GROUP)[None, :]
    scale = tl.load(s_ptr + rows64 * stride_sn + groups, mask=mask, other=0.0).to(tl.float32)
    if HAS_ZEROS:
        zero = tl.load(z_ptr + rows64 * stride_sn + groups, mask=mask, other=0).to(tl.float32)
    else:
        zero = (1 << (BITS - 1)) * 1.0
    w = (q.to(tl.float32) - zero) * scale
    tl.store(out_ptr + rows64 * stride_on + cols[None, :], w.to(out_ptr.dtype.element_ty),
             mask=mask)


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
    block_n, block_k = 32, 128
    grid = (triton.cdiv(n, block_n), triton.cdiv(k, block_k))
    _dequant_kernel[grid](qweight, scales, zeros if zeros is not None else scales, out, n, k,
                          qweight.stride(0), scales.stride(0), out.stride(0), GROUP=group,
                          BITS=bits, HAS_ZEROS=zeros is not None, BLOCK_N=block_n,
                          BLOCK_K=block_k)
    return out
