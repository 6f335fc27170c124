"""This step's K/V into the paged KV cache, with the rotary embedding of q and k fused in.

Cache layout (see models/layers/attention.py): ``[2, num_blocks, num_kv_heads, block_size,
head_dim]``. One program per token: it rotates the token's query heads in place (the attention
kernels read q afterwards) and writes its rotated K heads and its V heads to slot
``slot_mapping[t]`` (-1 = padding row: q is still rotated, harmlessly; nothing is written). At
decode this is one launch where rotary q, rotary k and the KV write were three.

Rotary follows models/layers/rotary.py: the first ``2 * cos.shape[-1]`` features of every head
are rotated, pairs interleaved (GLM: (0,1), (2,3), ...) or half-split (Llama: (i, i + half)),
with the PyTorch path's rounding points: cos/sin and each product rounded to the activation dtype
before the sum, which is rounded again. Without rotary the kernel only writes K and V.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from autoglm_serve.kernels import next_power_of_2, pdl
from autoglm_serve.kernels.pdl import wait_for_previous_grid


@triton.jit
def _rounded(x, dtype: tl.constexpr):
    # what a PyTorch op on `dtype` tensors stores: the float32 result rounded to dtype
    return x.to(dtype).to(tl.float32)


@triton.jit
def rotate_pairs(base, i1, i2, cos, sin, mask):
    """The rotated values of the pairs (base[i1], base[i2]): x1*cos - x2*sin, x2*cos + x1*sin."""
    x1 = tl.load(base + i1, mask=mask, other=0.0)
    x2 = tl.load(base + i2, mask=mask, other=0.0)
    return rotate_loaded(x1, x2, cos, sin)


@triton.jit
def load_rotated(base, d, mask, cos_row, sin_row, stride_cos_f, stride_sin_f,
                 ROTARY_HALF: tl.constexpr, INTERLEAVED: tl.constexpr):
    """The tile base + d (rows x features) with the first 2 * ROTARY_HALF features of each row
    rotated in registers, bit for bit as rotate_loaded: each feature is combined with its pair's
    other member, loaded a second time, so nothing is stored back (the decode kernel rotates q
    and the new k this way)."""
    x = tl.load(base + d, mask=mask, other=0.0)
    if ROTARY_HALF == 0:
        return x
    rotated = d < 2 * ROTARY_HALF
    if INTERLEAVED:
        freq = d // 2
        first = d % 2 == 0
        partner = d ^ 1
    else:
        first = d < ROTARY_HALF
        freq = tl.where(first, d, d - ROTARY_HALF)
        partner = tl.where(first, d + ROTARY_HALF, d - ROTARY_HALF)
    y = tl.load(base + tl.where(rotated, partner, d), mask=mask & rotated, other=0.0)
    c = _rounded(tl.load(cos_row + freq * stride_cos_f, mask=rotated, other=0.0), x.dtype)
    s = _rounded(tl.load(sin_row + freq * stride_sin_f, mask=rotated, other=0.0), x.dtype)
    # the pair's first member: x*cos - y*sin; its second: x*cos + y*sin (y its first member)
    xc = _rounded(x.to(tl.float32) * c, x.dtype)
    ys = _rounded(y.to(tl.float32) * s, x.dtype)
    return tl.where(rotated, tl.where(first, xc - ys, xc + ys).to(x.dtype), x)


@triton.jit
def rotate_loaded(x1, x2, cos, sin):
    """rotate_pairs on values already loaded."""
    c = _rounded(cos, x1.dtype)
    s = _rounded(sin, x1.dtype)
    a = x1.to(tl.float32)
    b = x2.to(tl.float32)
    r1 = (_rounded(a * c, x1.dtype) - _rounded(b * s, x1.dtype)).to(x1.dtype)
    r2 = (_rounded(b * c, x1.dtype) + _rounded(a * s, x1.dtype)).to(x1.dtype)
    return r1, r2


# An M-RoPE table's strides follow the step's token count: unspecialized, so that a new count
# never compiles the kernel again mid-serving.
@triton.jit(do_not_specialize=["stride_cos_t", "stride_cos_f", "stride_sin_t", "stride_sin_f"])
def _write_kv_kernel(q_ptr, k_ptr, v_ptr, cache_ptr, slot_ptr, cos_ptr, sin_ptr,
                     stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_cos_t, stride_cos_f, stride_sin_t, stride_sin_f,
                     stride_c_kv, stride_c_block, stride_c_head, stride_c_tok,
                     NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                     BLOCK_SIZE: tl.constexpr, ROTARY_HALF: tl.constexpr,
                     INTERLEAVED: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HKV: tl.constexpr,
                     BLOCK_HALF: tl.constexpr, BLOCK_TAIL: tl.constexpr, BLOCK_D: tl.constexpr,
                     PDL: tl.constexpr):
    wait_for_previous_grid(PDL)
    # Every load first, then every store: q, k and v are views of one qkv tensor, so the
    # compiler cannot move a load past a store, and this kernel (16 programs at a 16-row decode)
    # is bound by how many memory round trips it waits for in a row, not by bytes.
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t)
    hk = tl.arange(0, BLOCK_HKV)[:, None]
    k_base = k_ptr + t * stride_kt + hk * stride_kh
    if ROTARY_HALF > 0:
        f = tl.arange(0, BLOCK_HALF)[None, :]
        f_mask = f < ROTARY_HALF
        cos = tl.load(cos_ptr + t * stride_cos_t + f * stride_cos_f, mask=f_mask, other=0.0)
        sin = tl.load(sin_ptr + t * stride_sin_t + f * stride_sin_f, mask=f_mask, other=0.0)
        if INTERLEAVED:
            i1, i2 = 2 * f, 2 * f + 1
        else:
            i1, i2 = f, f + ROTARY_HALF
        hq = tl.arange(0, BLOCK_H)[:, None]
        q_mask = (hq < NUM_HEADS) & f_mask
        q_base = q_ptr + t * stride_qt + hq * stride_qh
        q_x1 = tl.load(q_base + i1, mask=q_mask, other=0.0)
        q_x2 = tl.load(q_base + i2, mask=q_mask, other=0.0)
        k_mask = (hk < NUM_KV_HEADS) & f_mask
        k_x1 = tl.load(k_base + i1, mask=k_mask, other=0.0)
        k_x2 = tl.load(k_base + i2, mask=k_mask, other=0.0)
    if 2 * ROTARY_HALF < HEAD_DIM:
        # the features past the rotary part (all of them without rotary) are copied unchanged
        d_tail = 2 * ROTARY_HALF + tl.arange(0, BLOCK_TAIL)[None, :]
        tail_mask = (hk < NUM_KV_HEADS) & (d_tail < HEAD_DIM)
        k_tail = tl.load(k_base + d_tail, mask=tail_mask)
    d = tl.arange(0, BLOCK_D)[None, :]
    v_mask = (hk < NUM_KV_HEADS) & (d < HEAD_DIM)
    v = tl.load(v_ptr + t * stride_vt + hk * stride_vh + d, mask=v_mask)

    if ROTARY_HALF > 0:
        # q in place. Each thread stores exactly the pair it loaded: no thread reads a feature
        # that another one has already overwritten.
        q1, q2 = rotate_loaded(q_x1, q_x2, cos, sin)
        tl.store(q_base + i1, q1, mask=q_mask)
        tl.store(q_base + i2, q2, mask=q_mask)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    dst = cache_ptr + block * stride_c_block + hk * stride_c_head + offset * stride_c_tok
    out_ty = cache_ptr.dtype.element_ty
    if ROTARY_HALF > 0:
        k1, k2 = rotate_loaded(k_x1, k_x2, cos, sin)
        tl.store(dst + i1, k1.to(out_ty), mask=k_mask)
        tl.store(dst + i2, k2.to(out_ty), mask=k_mask)
    if 2 * ROTARY_HALF < HEAD_DIM:
        tl.store(dst + d_tail, k_tail.to(out_ty), mask=tail_mask)
    tl.store(dst + stride_c_kv + d, v.to(out_ty), mask=v_mask)


def _launch(q, k, v, kv_cache, slot_mapping, cos, sin, interleaved: bool) -> None:
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    assert k.stride(-1) == 1 and v.stride(-1) == 1 and kv_cache.stride(-1) == 1
    half = cos.shape[-1] if cos is not None else 0
    num_heads = q.shape[1] if q is not None else 0
    if half:
        assert q.stride(-1) == 1
    tail = head_dim - 2 * half
    _write_kv_kernel[(num_tokens,)](
        q if q is not None else k, k, v, kv_cache, slot_mapping,
        cos if half else k, sin if half else k,
        q.stride(0) if half else 0, q.stride(1) if half else 0,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        *(cos.stride() + sin.stride() if half else (0, 0, 0, 0)),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_SIZE=kv_cache.shape[3], ROTARY_HALF=half, INTERLEAVED=interleaved,
        BLOCK_H=next_power_of_2(max(1, num_heads)),
        BLOCK_HKV=next_power_of_2(num_kv_heads),
        BLOCK_HALF=next_power_of_2(max(1, half)),
        BLOCK_TAIL=next_power_of_2(max(1, tail)),
        BLOCK_D=next_power_of_2(head_dim), num_warps=4 if half else 1,
        **pdl.launch_options(k.device))


def write_kv_cache(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    """k, v: [T, Hkv, D] (last dim contiguous); writes row t to slot slot_mapping[t] unless -1."""
    _launch(None, k, v, kv_cache, slot_mapping, None, None, False)


def rotate_and_write_kv_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                              cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> None:
    """Rotates q [T, H, D] in place and writes the rotated k and v ([T, Hkv, D]) as
    write_kv_cache does; cos, sin: [T, rotary_dim // 2] float32 (any strides). Every row
    of q is rotated, padding rows (slot -1) included."""
    _launch(q, k, v, kv_cache, slot_mapping, cos, sin, interleaved)
