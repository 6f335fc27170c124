"""Fused elementwise kernels for the decoder layer on CUDA.

A GLM-4 layer in plain PyTorch launches ~60 kernels, ~50 of them tiny elementwise ones (four
RMSNorms of ~9 ops each, rotary of ~20, SiLU-and-mul of 2). At decode even inside a CUDA graph
each costs 1.5-2.5 us, which over 40 layers is as long as the step's matrix work. These kernels
do each of those groups in one pass, with the same rounding points as the PyTorch code (float32
statistics, results rounded to the activation dtype where PyTorch rounds them); GLM-4's norm of a
sublayer's output, the residual add and the next norm are one pass too (``rms_norm_pair``), which
before an FP8 layer also writes its input quantized per token (kernels/fp8_rows.py).

``ENABLED`` turns them on (and the rotary fused into the KV write, kernels/kv_write.py);
engine/core/kernel_checks.py runs each once against its PyTorch twin at start-up and switches them off
(with a warning) if one fails or disagrees, so a kernel problem on a new GPU or Triton version
costs speed, never correctness.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from autoglm_serve.kernels import next_power_of_2, pdl
from autoglm_serve.kernels.fp8_rows import FP8, Fp8Rows, row_codes, row_scale
from autoglm_serve.kernels.kv_write import rotate_pairs
from autoglm_serve.kernels.pdl import let_dependents_launch, wait_for_previous_grid

ENABLED = True


@triton.jit
def _weighted_rms_norm(x, w, n_cols, eps):
    """w * norm(x): float32 statistics, the normed row rounded to x's dtype before the weight
    and the product rounded again, as RMSNorm does in PyTorch."""
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    normed = (xf * rstd).to(x.dtype)
    return (w.to(tl.float32) * normed.to(tl.float32)).to(x.dtype)


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, new_res_ptr, first_w_ptr, amax_ptr, q_ptr,
                     s_ptr, n_cols, eps, first_eps, HAS_RESIDUAL: tl.constexpr,
                     NORM_X_FIRST: tl.constexpr, WRITE_AMAX: tl.constexpr,
                     WRITE_CODES: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    # A few rows at decode: the kernel's time is its chain of memory round trips, so every load
    # is issued up front, the weights (which no kernel writes) even before the PDL wait.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    if NORM_X_FIRST:
        first_w = tl.load(first_w_ptr + cols, mask=mask, other=0.0)
    wait_for_previous_grid(PDL)
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * n_cols + cols, mask=mask, other=0.0)
    let_dependents_launch(PDL)
    if NORM_X_FIRST:
        # x is a sublayer's output that has its own norm before the residual add (GLM-4)
        x = _weighted_rms_norm(x, first_w, n_cols, first_eps)
    if HAS_RESIDUAL:
        # the sum is rounded to the activation dtype first, as `x + residual` is in PyTorch
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(new_res_ptr + row * n_cols + cols, x, mask=mask)
    out = _weighted_rms_norm(x, w, n_cols, eps)
    tl.store(out_ptr + row * n_cols + cols, out, mask=mask)
    if WRITE_AMAX:  # the next FP8 layer's input: the rows as stored, quantized per token
        amax = tl.max(tl.abs(out.to(tl.float32)), axis=0)      # columns past n_cols are 0
        tl.store(amax_ptr + row, amax)
        if WRITE_CODES:
            scale = row_scale(amax)
            tl.store(s_ptr + row, scale)
            tl.store(q_ptr + row * n_cols + cols, row_codes(out, scale), mask=mask)


def _launch_rms_norm(x, weight, eps, residual, first_weight, first_eps, fp8=False):
    x = x.contiguous()
    n_cols = x.shape[-1]
    rows = x.numel() // n_cols
    out = torch.empty_like(x)
    new_res = torch.empty_like(x) if residual is not None else out
    fp8_rows = None
    codes = fp8 and rows > 1      # one row goes to the FP8 GEMV, which quantizes it itself
    if fp8:
        fp8_rows = Fp8Rows(
            torch.empty(rows, n_cols, dtype=FP8, device=x.device) if codes else None,
            torch.empty(rows, 1, dtype=torch.float32, device=x.device) if codes else None,
            torch.empty(rows, dtype=torch.float32, device=x.device))
    amax = fp8_rows.amax if fp8 else out
    _rms_norm_kernel[(rows,)](x, residual.contiguous() if residual is not None else x, weight, out,
                              new_res, first_weight if first_weight is not None else weight,
                              amax, fp8_rows.codes if codes else out,
                              fp8_rows.scale if codes else out, n_cols, eps, first_eps,
                              HAS_RESIDUAL=residual is not None,
                              NORM_X_FIRST=first_weight is not None, WRITE_AMAX=fp8,
                              WRITE_CODES=codes,
                              BLOCK=next_power_of_2(n_cols), num_warps=8 if n_cols >= 2048 else 4,
                              **pdl.launch_options(x.device))
    return out, new_res, fp8_rows


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None):
    """norm(x) or, with residual, (norm(x + residual), x + residual)."""
    out, new_res, _ = _launch_rms_norm(x, weight, eps, residual, None, 0.0)
    return out if residual is None else (out, new_res)


def rms_norm_pair(x: torch.Tensor, residual: torch.Tensor, first_weight: torch.Tensor,
                  first_eps: float, weight: torch.Tensor, eps: float, fp8: bool = False):
    """(norm(first_norm(x) + residual), first_norm(x) + residual, fp8_rows) in one pass;
    fp8_rows: where ``fp8`` asks, the normed rows as stored quantized per token for an FP8 layer
    (kernels/fp8_rows.Fp8Rows: each row's amax, and from two rows the codes and scales of
    quantization/fp8.quantize_rows), else None."""
    return _launch_rms_norm(x, weight, eps, residual, first_weight, first_eps, fp8)


@triton.jit
def silu_mul(gate, up):
    """silu(gate) * up with PyTorch's rounding points: silu rounded to gate's dtype, then the
    product (kernels/fp8_quant.py's fused quantization computes it by this too)."""
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
    return (act.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, d, BLOCK: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    wait_for_previous_grid(PDL)
    gate = tl.load(x_ptr + row * 2 * d + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * 2 * d + d + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * d + cols, silu_mul(gate, up), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    d = x.shape[-1] // 2
    rows = x.numel() // (2 * d)
    out = torch.empty(*x.shape[:-1], d, dtype=x.dtype, device=x.device)
    block = min(1024, next_power_of_2(d))
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
                         HALF=half, BLOCK_H=next_power_of_2(num_heads), INTERLEAVED=interleaved)
    return x

