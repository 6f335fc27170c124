"""Varlen (non-paged) attention for the vision tower: the patches of several images packed in one
[T, H, D] batch, image i owning rows cu_seqlens[i] .. cu_seqlens[i+1]; full (bidirectional)
attention within each image by default, causal on request.

Two implementations with one signature: ``varlen_attention`` (one Triton launch for all images,
no host sync) and ``sdpa_varlen_attention`` (torch SDPA per image, which picks cuDNN / flash
kernels on Hopper but needs the image boundaries on the host). bench/gpu/attention_bench.py
times both at GLM-4.1V's ViT shape (12 heads x 128, ~12k patches per screenshot) to choose.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
BLOCK_M = 128
BLOCK_N = 64


@triton.jit
def _varlen_kernel(out_ptr, q_ptr, k_ptr, v_ptr, cu_seqlens_ptr, scale_log2, num_q_tiles,
                   stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                   stride_ot, stride_oh,
                   CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    # Causal: late tiles are the heavy ones, launch them first; bidirectional tiles are all equal.
    tile = num_q_tiles - 1 - tl.program_id(0) if CAUSAL else tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)
    start = tl.load(cu_seqlens_ptr + seq)
    seq_len = tl.load(cu_seqlens_ptr + seq + 1) - start
    first = tile * BLOCK_M
    if first >= seq_len:
        return
    m = first + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    m_mask = m < seq_len
    d_mask = d < HEAD_DIM
    rows = (start + m).to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * stride_qt + head * stride_qh + d[None, :],
                mask=m_mask[:, None] & d_mask[None, :], other=0.0)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    kv_end = tl.minimum(first + BLOCK_M, seq_len) if CAUSAL else seq_len
    k_base = k_ptr + start.to(tl.int64) * stride_kt + head * stride_kh
    v_base = v_ptr + start.to(tl.int64) * stride_vt + head * stride_vh
    for lo in range(0, kv_end, BLOCK_N):
        n = lo + tl.arange(0, BLOCK_N)
        n_mask = n < kv_end
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_base + n[:, None] * stride_kt + d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        keep = n_mask[None, :]
        if CAUSAL:
            keep = keep & (n[None, :] <= m[:, None])
        s = tl.where(keep, s, float("-inf"))
        # Key 0 is visible to every row and sits in the first tile, so m_new is always finite.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + n[:, None] * stride_vt + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    o = acc / l_i[:, None]
    tl.store(out_ptr + rows[:, None] * stride_ot + head * stride_oh + d[None, :],
             o.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                     max_seqlen: int, scale: float, causal: bool = False,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """q, k, v: [T, H, D] (last dim contiguous; same H: the ViT has no GQA); cu_seqlens: int32
    [B + 1] on the device; max_seqlen: host int sizing the grid. Returns [T, H, D]."""
    t, num_heads, head_dim = q.shape
    assert k.shape == q.shape and v.shape == q.shape
    if out is None:
        out = torch.empty_like(q)
    num_seqs = cu_seqlens.shape[0] - 1
    if t == 0 or num_seqs == 0 or max_seqlen == 0:
        return out
    fp32 = q.dtype == torch.float32
    num_q_tiles = triton.cdiv(max_seqlen, BLOCK_M)
    _varlen_kernel[(num_q_tiles, num_seqs, num_heads)](
        out, q, k, v, cu_seqlens, scale * LOG2E, num_q_tiles,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1),
        CAUSAL=causal, HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N // 2 if fp32 else BLOCK_N,
        PRECISION="ieee" if fp32 else "tf32", num_warps=8, num_stages=2 if fp32 else 3)
    return out


def sdpa_varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          cu_seqlens_cpu: list[int], scale: float,
                          causal: bool = False) -> torch.Tensor:
    """The same with torch SDPA, one call per image (boundaries on the host)."""
    out = torch.empty_like(q)
    for s, e in zip(cu_seqlens_cpu[:-1], cu_seqlens_cpu[1:]):
        if e > s:
            qi, ki, vi = (x[s:e].transpose(0, 1).unsqueeze(0) for x in (q, k, v))
            o = F.scaled_dot_product_attention(qi, ki, vi, is_causal=causal, scale=scale)
            out[s:e] = o.squeeze(0).transpose(0, 1)
    return out
