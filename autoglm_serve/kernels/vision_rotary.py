"""The vision tower's 2-D rotary on q and k of its fused qkv projection, in one pass.

The PyTorch path upcasts q and k to float32, builds rotate_half copies, multiplies and casts
back: about ten kernels over [patches, 2, heads, head_dim] per block, ~24 blocks per image, which
for a 12k-patch phone screenshot is several milliseconds of pure memory traffic. This kernel
reads each (token, head) row of q and k once and writes it rotated in place, with the same
arithmetic (float32 cos/sin, float32 products, one rounding to the activation dtype at the end).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from autoglm_serve.kernels import next_power_of_2


@triton.jit
def _vision_rotary_kernel(qkv_ptr, cos_ptr, sin_ptr, stride_t, stride_part, num_heads,
                          HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    """Program (token, q-or-k): every head of that token, half-split pairs (i, i + HALF)."""
    t = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)             # 0 = q, 1 = k (v, part 2, is left alone)
    heads = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, HALF)[None, :]
    hmask = heads < num_heads
    cos = tl.load(cos_ptr + t * HALF + i)
    sin = tl.load(sin_ptr + t * HALF + i)
    base = qkv_ptr + t * stride_t + part * stride_part + heads * (2 * HALF)
    x1 = tl.load(base + i, mask=hmask, other=0.0)
    x2 = tl.load(base + i + HALF, mask=hmask, other=0.0)
    a, b = x1.to(tl.float32), x2.to(tl.float32)
    tl.store(base + i, (a * cos - b * sin).to(x1.dtype), mask=hmask)
    tl.store(base + i + HALF, (b * cos + a * sin).to(x1.dtype), mask=hmask)


def rotate_qk_(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates q and k of ``qkv`` [N, 3, heads, head_dim] in place (features contiguous);
    cos, sin: [N, head_dim // 2] float32 (the half that both halves of a head share)."""
    n, three, num_heads, head_dim = qkv.shape
    assert three == 3 and qkv.stride(-1) == 1 and qkv.stride(-2) == head_dim
    half = head_dim // 2
    assert half & (half - 1) == 0, "head_dim / 2 must be a power of two"
    if n == 0:
        return qkv
    _vision_rotary_kernel[(n, 2)](qkv, cos.float().contiguous(), sin.float().contiguous(),
                                  qkv.stride(0), qkv.stride(1), num_heads, HALF=half,
                                  BLOCK_H=next_power_of_2(num_heads))
    return qkv
