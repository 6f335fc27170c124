"""Fused elementwise kernels for the decoder layer on CUDA.

A GLM-4 layer in plain PyTorch launches ~60 kernels, ~50 of them tiny elementwise ones (four
RMSNorms of ~9 ops each, rotary of ~20, SiLU-and-mul of 2). At decode even inside a CUDA graph
each costs 1.5-2.5 us, which over 40 layers is as long as the step's matrix work. These kernels
do each of those groups in one pass, with the same rounding points as the PyTorch code (float32
statistics, results rounded to the activation dtype where PyTorch rounds them); GLM-4's norm of a
sublayer's output, the residual add and the next norm are one pass too (``rms_norm_pair``).

``ENABLED`` turns them on (and the rotary fused into the KV write, kernels/kv_write.py);
``self_check`` runs each once against its PyTorch twin at start-up and switches them off (with a
warning) if one fails or disagrees, so a kernel problem on a new GPU or Triton version costs
speed, never correctness.
"""
from __future__ import annotations

import logging

import torch
import triton
import triton.language as tl

from autoglm_serve.kernels import pdl
from autoglm_serve.kernels.kv_write import rotate_pairs
from autoglm_serve.kernels.pdl import wait_for_previous_grid

logger = logging.getLogger(__name__)

ENABLED = True


def _pow2(n: int) -> int:
    return triton.next_power_of_2(n)


@triton.jit
def _weighted_rms_norm(x, w_ptr, cols, mask, n_cols, eps):
    """weight * norm(x): float32 statistics, the normed row rounded to x's dtype before the
    weight and the product rounded again, as RMSNorm does in PyTorch."""
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    normed = (xf * rstd).to(x.dtype)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    return (w.to(tl.float32) * normed.to(tl.float32)).to(x.dtype)


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, new_res_ptr, first_w_ptr, n_cols, eps,
                     first_eps, HAS_RESIDUAL: tl.constexpr, NORM_X_FIRST: tl.constexpr,
                     BLOCK: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    wait_for_previous_grid(PDL)
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    if NORM_X_FIRST:
        # x is a sublayer's output that has its own norm before the residual add (GLM-4)
        x = _weighted_rms_norm(x, first_w_ptr, cols, mask, n_cols, first_eps)
    if HAS_RESIDUAL:
        # the sum is rounded to the activation dtype first, as `x + residual` is in PyTorch
        r = tl.load(res_ptr + row * n_cols + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(new_res_ptr + row * n_cols + cols, x, mask=mask)
    tl.store(out_ptr + row * n_cols + cols, _weighted_rms_norm(x, w_ptr, cols, mask, n_cols, eps),
             mask=mask)


def _launch_rms_norm(x, weight, eps, residual, first_weight, first_eps):
    x = x.contiguous()
    n_cols = x.shape[-1]
    rows = x.numel() // n_cols
    out = torch.empty_like(x)
    new_res = torch.empty_like(x) if residual is not None else out
    _rms_norm_kernel[(rows,)](x, residual.contiguous() if residual is not None else x, weight, out,
                              new_res, first_weight if first_weight is not None else weight,
                              n_cols, eps, first_eps, HAS_RESIDUAL=residual is not None,
                              NORM_X_FIRST=first_weight is not None, BLOCK=_pow2(n_cols),
                              num_warps=8 if n_cols >= 2048 else 4, **pdl.launch_options(x.device))
    return out if residual is None else (out, new_res)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None):
    """norm(x) or, with residual, (norm(x + residual), x + residual)."""
    return _launch_rms_norm(x, weight, eps, residual, None, 0.0)


def rms_norm_pair(x: torch.Tensor, residual: torch.Tensor, first_weight: torch.Tensor,
                  first_eps: float, weight: torch.Tensor, eps: float):
    """(norm(first_norm(x) + residual), first_norm(x) + residual) in one pass."""
    return _launch_rms_norm(x, weight, eps, residual, first_weight, first_eps)


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, d, BLOCK: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    wait_for_previous_grid(PDL)
    gate = tl.load(x_ptr + row * 2 * d + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * 2 * d + d + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
    tl.store(out_ptr + row * d + cols, (act.to(tl.float32) * up.to(tl.float32)).to(gate.dtype),
             mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    d = x.shape[-1] // 2
    rows = x.numel() // (2 * d)
    out = torch.empty(*x.shape[:-1], d, dtype=x.dtype, device=x.device)
    block = min(1024, _pow2(d))
    _silu_mul_kernel[(rows, triton.cdiv(d, block))](x, out, d, BLOCK=block,
                                                    **pdl.launch_options(x.device))
    return out


@triton.jit
def _rotary_kernel(x_ptr, cos_ptr, sin_ptr, stride_t, num_heads, head_dim,
                   HALF: tl.constexpr, BLOCK_H: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Rotates the first 2*HALF features of every head of one token, in place."""
    t = tl.program_id(0).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)[:, None]
    k = tl.arange(0, HALF)[None, :]
    hmask = heads < num_heads
    cos = tl.load(cos_ptr + t * HALF + k)
    sin = tl.load(sin_ptr + t * HALF + k)
    base = x_ptr + t * stride_t + heads * head_dim
    if INTERLEAVED:
        i1, i2 = 2 * k, 2 * k + 1
    else:
        i1, i2 = k, k + HALF
    # the PyTorch path's rounding points, as in the KV write's fused rotary
    r1, r2 = rotate_pairs(base, i1, i2, cos, sin, hmask)
    tl.store(base + i1, r1, mask=hmask)
    tl.store(base + i2, r2, mask=hmask)


def rotary_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int,
            interleaved: bool) -> torch.Tensor:
    """In place on x [T, heads * head_dim] (rows may be strided, features contiguous);
    cos, sin [T, rotary_dim // 2] float32."""
    t = x.shape[0]
    if t == 0:
        return x
    half = cos.shape[-1]
    num_heads = x.shape[-1] // head_dim
    _rotary_kernel[(t,)](x, cos.contiguous(), sin.contiguous(), x.stride(0), num_heads, head_dim,
                         HALF=half, BLOCK_H=_pow2(num_heads), INTERLEAVED=interleaved)
    return x


def self_check(device: torch.device, dtype: torch.dtype) -> bool:
    """Runs every kernel once against PyTorch on random data at AutoGLM-Phone-9B's shapes (the
    rotary + KV-cache write of kernels/kv_write.py included); disables them on any problem."""
    global ENABLED
    from autoglm_serve.kernels.kv_write import rotate_and_write_kv_cache
    from autoglm_serve.models.layers import norm as norm_layers
    from autoglm_serve.models.layers.activation import SiluAndMul
    from autoglm_serve.models.layers.rotary import RotaryEmbedding
    from autoglm_serve.models.layers.torch_attention import write_kv_cache

    def close(a, b):
        return bool(((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-6)) < 2e-2)

    was = ENABLED
    try:
        ENABLED = False
        x = torch.randn(7, 4096, device=device, dtype=dtype)
        r = torch.randn_like(x)
        norm = norm_layers.RMSNorm(4096, 1e-5, dtype).to(device)
        norm.weight.data.uniform_(0.5, 1.5)
        first_norm = norm_layers.RMSNorm(4096, 1e-5, dtype).to(device)
        first_norm.weight.data.uniform_(0.5, 1.5)
        ref_out, ref_res = norm(x, r)
        ref_plain = norm(x)
        ref_pair_out, ref_pair_res = norm_layers.rms_norm_pair(first_norm, norm, x, r)
        g = torch.randn(7, 2 * 1000, device=device, dtype=dtype)
        ref_silu = SiluAndMul()(g)
        rot = RotaryEmbedding(128, 64, 4096, 10000.0, interleaved=True).to(device)
        pos = torch.randint(0, 4096, (7,), device=device)
        q = torch.randn(7, 32 * 128, device=device, dtype=dtype)
        kq = torch.randn(7, 2 * 128, device=device, dtype=dtype)
        v = torch.randn(7, 2, 128, device=device, dtype=dtype)
        ref_q, ref_k = rot(pos, q.clone(), kq.clone())
        cos, sin = rot.cos_sin(pos)
        slots = torch.tensor([0, 5, 17, -1, 33, 40, 63], device=device)
        cache = torch.zeros(2, 4, 2, 16, 128, device=device, dtype=dtype)
        ref_cache = cache.clone()
        write_kv_cache(ref_k.view(7, 2, 128), v, ref_cache, slots)

        out, res = rms_norm(x, norm.weight, 1e-5, r)
        ok = close(out, ref_out) and close(res, ref_res) and close(rms_norm(x, norm.weight, 1e-5),
                                                                    ref_plain)
        out, res = rms_norm_pair(x, r, first_norm.weight, 1e-5, norm.weight, 1e-5)
        ok = ok and close(out, ref_pair_out) and close(res, ref_pair_res)
        ok = ok and close(silu_and_mul(g), ref_silu)
        ok = ok and close(rotary_(q.clone(), cos, sin, 128, True), ref_q)
        ok = ok and close(rotary_(kq.clone(), cos, sin, 128, True), ref_k)
        rotate_and_write_kv_cache(q.view(7, 32, 128), kq.view(7, 2, 128), v, cache, slots, cos,
                                  sin, interleaved=True)
        ok = ok and close(q, ref_q) and close(cache, ref_cache)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:  # a compile or launch failure: run the PyTorch ops instead
        logger.warning("fused kernels disabled: %r", exc)
        ok = False
    ENABLED = was and ok
    if not ok:
        logger.warning("fused kernels disagree with PyTorch or failed: using PyTorch ops")
    return ENABLED
