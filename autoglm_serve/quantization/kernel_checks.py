"""Start-up self-check of the quantized decode GEMVs (kernels/w4a16_gemv.py, w8a16_gemv.py,
fp8_gemv.py) and the split-K FP8 GEMM (kernels/fp8_gemm.py) against the dequantize-then-matmul
references, on every path once and every tuned config at its own rows and K, and of the FP8
activation quantization (kernels/fp8_quant.py) against the torch ops. It lives above the kernels
(they must not import quantization back) and runs only for the kernels the loaded model uses,
before CUDA-graph capture (it compiles).
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from autoglm_serve.kernels import fp8_gemm, fp8_gemv, fp8_quant, fused_ops
from autoglm_serve.kernels.gemv import GemvConfig, tuned_check_shapes
from autoglm_serve.models.layers.linear import LinearBase
from autoglm_serve.quantization.fp8 import Fp8LinearMethod, quantize_rows
from autoglm_serve.quantization.packing import pack_last_dim
from autoglm_serve.quantization.wna16 import (WNA16LinearMethod, decode_gemv_kernel,
                                              dequantize)

logger = logging.getLogger(__name__)


def wna16_reference(x, qweight, scales, zeros, bits, group, bias=None, gated=False):
    """Dequantize-then-matmul with fp32 products; gated: gate and up rounded to x's dtype, then
    silu(gate) rounded, times up (the unfused path's rounding points)."""
    w = dequantize(qweight, scales, zeros, bits, torch.float32)
    out = F.linear(x.float(), w, None if bias is None else bias.float())
    return _gate(out, x.dtype) if gated else out


def w4a16_reference(x, qweight, scales, zeros, group, bias=None, gated=False):
    return wna16_reference(x, qweight, scales, zeros, 4, group, bias, gated)


def fp8_reference(x, weight, weight_scale, bias=None, gated=False):
    """The W8A8 product of the dequantized operands, activations quantized per token."""
    xq, xs = quantize_rows(x.reshape(-1, x.shape[-1]))
    out = (xq.float() * xs) @ (weight.float() * weight_scale.view(-1, 1)).t()
    if bias is not None:
        out = out + bias.float()
    out = _gate(out, x.dtype) if gated else out
    return out.view(*x.shape[:-1], -1)


def _gate(out, dtype):
    gate, up = out.to(dtype).chunk(2, dim=-1)
    return F.silu(gate.float()).to(dtype).float() * up.float()


def random_wn(n, k, bits, group, zeros, dtype, device, gen):
    """(qweight, scales, zeros) of ``bits``-bit codes in our packed layout, with scales of a
    plausible size for them; drawn on ``gen``'s device."""
    on, levels = gen.device, 1 << bits
    q = torch.randint(0, levels, (n, k), generator=gen, device=on)
    s = ((torch.rand(n, k // group, generator=gen, device=on) * 0.02 + 0.001) * 16 / levels
         ).to(dtype)
    z = (torch.randint(0, levels, (n, k // group), generator=gen, dtype=torch.uint8, device=on)
         if zeros else None)
    return pack_last_dim(q, bits).to(device), s.to(device), None if z is None else z.to(device)


def random_w4(n, k, group, zeros, dtype, device, gen):
    return random_wn(n, k, 4, group, zeros, dtype, device, gen)


def random_fp8(n, k, device, gen):
    q, s = quantize_rows(torch.randn(n, k, generator=gen, device=gen.device) * k ** -0.5)
    return q.to(device), s.view(-1).to(device)


def wna16_cases(device, dtype, bits):
    """(name, x, (qweight, scales, zeros), group, bias, gated, config) for the ``bits``-bit
    decode GEMV: every path once on small shapes (CUDA cores at one row, tensor cores at more,
    groups within and across a tile, split-K, gating), then every tuned config at its own rows
    and K."""
    kernel = decode_gemv_kernel(bits)[0]
    gen = torch.Generator().manual_seed(0)
    cases = []
    for m in (1, 3, kernel.MAX_ROWS):
        x = torch.randn(m, 1024, generator=gen).to(device, dtype)
        split = GemvConfig(16, 256, 2, dot=m > 1)
        for group, zeros in ((128, True), (32, False)):
            bias = torch.randn(100, generator=gen).to(device, dtype)
            cases += [(f"{m} rows, group {group}", x,
                       random_wn(100, 1024, bits, group, zeros, dtype, device, gen), group, bias,
                       False, None),
                      (f"{m} rows, group {group}, gated split-K", x,
                       random_wn(144, 1024, bits, group, zeros, dtype, device, gen), group, None,
                       True, split)]
    for (kind, m, n, k, group), cfg, rows in tuned_check_shapes(kernel.TUNED):
        cases.append((f"tuned {kind} {m}x{n}x{k}/{group}",
                      torch.randn(m, k, generator=gen).to(device, dtype),
                      random_wn(rows, k, bits, group, True, dtype, device, gen), group, None,
                      kind == "gated", cfg))
    return cases


def fp8_cases(device, dtype):
    """(name, x, (weight, weight_scale), bias, gated, config)."""
    gen = torch.Generator().manual_seed(0)
    cases = []
    for m in (1, 3):
        x = torch.randn(m, 1024, generator=gen).to(device, dtype)
        split = GemvConfig(16, 256, 2, dot=m > 1)
        cases += [(f"{m} rows, bias", x, random_fp8(100, 1024, device, gen),
                   torch.randn(100, generator=gen).to(device, dtype), False, None),
                  (f"{m} rows, K not a multiple of the tile",
                   torch.randn(m, 1000, generator=gen).to(device, dtype),
                   random_fp8(100, 1000, device, gen), None, False, None),
                  (f"{m} rows, gated split-K", x, random_fp8(144, 1024, device, gen), None, True,
                   split)]
    for (kind, m, n, k), cfg, rows in tuned_check_shapes(fp8_gemv.TUNED):
        x = torch.randn(m, k, generator=gen).to(device, dtype)
        cases.append((f"tuned {kind} {m}x{n}x{k}", x, random_fp8(rows, k, device, gen), None,
                      kind == "gated", cfg))
    return cases


def fp8_gemm_cases(device, dtype):
    """(name, x, (weight, weight_scale), bias, config): partial tiles of M and N, a partial K
    chunk, bias, split-K; then every tuned config at its own rows bucket and K, N cut to two
    tiles and a partial one of 16 rows (N stays a multiple of 16: Triton specializes on that,
    and the model's N are)."""
    gen = torch.Generator().manual_seed(0)
    cases = []
    for cfg in (fp8_gemm.GemmConfig(16, 64, 128), fp8_gemm.GemmConfig(32, 64, 128, split_k=3)):
        x = torch.randn(40, 1000, generator=gen).to(device, dtype)
        cases.append((f"40 rows, {cfg}", x, random_fp8(100, 1000, device, gen),
                      torch.randn(100, generator=gen).to(device, dtype), cfg))
    for (bucket, n, k), cfg in fp8_gemm.TUNED.items():
        if cfg is not None:
            x = torch.randn(bucket, k, generator=gen).to(device, dtype)
            cases.append((f"tuned {bucket}x{n}x{k}", x,
                          random_fp8(min(n, 2 * cfg.block_n + 16), k, device, gen), None, cfg))
    return cases


def _rel_err(got, want) -> float:
    want = want.float()
    return ((got.float() - want).norm() / want.norm().clamp_min(1e-6)).item()


def _check(kernel, runs, what, reference, fallback) -> bool:
    """Compares each (name, kernel output, reference output) of ``runs``; on a compile or
    launch failure or a disagreement sets ``kernel.ENABLED = False`` (``fallback`` then runs).
    Returns ``kernel.ENABLED``."""
    try:
        for name, got, want in runs:
            err = _rel_err(got, want)
            if not err < 2e-2:
                logger.warning("%s disagrees with %s (%s: relative error %.3g): using %s", what,
                               reference, name, err, fallback)
                kernel.ENABLED = False
                break
    except Exception as exc:
        logger.warning("%s disabled: %r", what, exc)
        kernel.ENABLED = False
    return kernel.ENABLED


def check_wna16_gemv(device: torch.device, dtype: torch.dtype, bits: int) -> bool:
    """The ``bits``-bit decode GEMV (kernels/w4a16_gemv.py, w8a16_gemv.py): sets its
    ``ENABLED = False`` (kernels/wna16.py then runs) on a compile or launch failure or a
    disagreement; returns ``ENABLED``."""
    kernel, linear, gated_linear = decode_gemv_kernel(bits)
    if dtype not in kernel.DTYPES:
        return kernel.ENABLED

    def runs():   # a generator: the cases are drawn inside _check's try
        for name, x, (qw, s, z), group, bias, gated, cfg in wna16_cases(device, dtype, bits):
            got = (gated_linear(x, qw, s, z, group, cfg) if gated
                   else linear(x, qw, s, z, group, bias, cfg))
            yield name, got, wna16_reference(x, qw, s, z, bits, group, bias, gated)
    return _check(kernel, runs(), f"W{bits}A16 GEMV", "dequantize-then-matmul",
                  "the GEMM kernel")


def check_fp8_gemv(device: torch.device, dtype: torch.dtype) -> bool:
    """Sets ``fp8_gemv.ENABLED = False`` (``_scaled_mm`` then runs) on a failure or a
    disagreement; returns ``ENABLED``."""
    if dtype not in fp8_gemv.DTYPES:
        return fp8_gemv.ENABLED

    def runs():   # each case as the GEMV's own amax pass and given the norm's row amax
        for name, x, (w, ws), bias, gated, cfg in fp8_cases(device, dtype):
            want = fp8_reference(x, w, ws, bias, gated)
            for amax in (None, x.float().abs().amax(dim=-1)):
                got = (fp8_gemv.fp8_gated_gemv(x, w, ws, cfg, amax) if gated
                       else fp8_gemv.fp8_gemv(x, w, ws, bias, cfg, amax))
                yield name + ("" if amax is None else ", row amax given"), got, want
    return _check(fp8_gemv, runs(), "FP8 GEMV", "the W8A8 reference", "_scaled_mm")


def check_fp8_gemm(device: torch.device, dtype: torch.dtype) -> bool:
    """Sets ``fp8_gemm.ENABLED = False`` (``_scaled_mm`` then runs) on a failure or a
    disagreement; returns ``ENABLED``."""
    if dtype not in fp8_gemm.DTYPES:
        return fp8_gemm.ENABLED

    def runs():
        for name, x, (w, ws), bias, cfg in fp8_gemm_cases(device, dtype):
            xq, xs = quantize_rows(x)
            yield (name, fp8_gemm.fp8_gemm(xq, xs, w, ws, bias, dtype, cfg),
                   fp8_reference(x, w, ws, bias))
    return _check(fp8_gemm, runs(), "FP8 split-K GEMM", "the W8A8 reference", "_scaled_mm")


def check_fp8_quant(device: torch.device, dtype: torch.dtype) -> bool:
    """The FP8 activation quantization kernels (kernels/fp8_quant.py, and the codes the fused
    norm pair writes for the FP8 layer after it), each against the torch ops bit for bit: they
    decide every e4m3 code. Sets ``fp8_quant.ENABLED = False`` (the torch ops then run, and the
    norms write no codes) on a failure or a difference; returns ``ENABLED``."""
    try:
        gen = torch.Generator().manual_seed(0)
        x = (torch.randn(6, 1000, generator=gen) * torch.logspace(-3, 2, 6)[:, None]).to(
            device, dtype)
        x[2] = 0                  # the minimum scale
        gate_up = torch.randn(5, 2 * 1000, generator=gen).to(device, dtype)
        norm_w = (torch.rand(1000, generator=gen) + 0.5).to(device, dtype)
        normed, _, fp8_rows = fused_ops.rms_norm_pair(x, x.flip(0), norm_w, 1e-5, norm_w, 1e-6,
                                                      fp8=True)
        # the fused product against the SiLU kernel's, the norm's codes against its own output
        # (check_fused_ops compares those with PyTorch's; without it the layers run neither)
        cases = [(quantize_rows(x), fp8_quant.quantize_rows(x)),
                 (quantize_rows(fused_ops.silu_and_mul(gate_up)),
                  fp8_quant.silu_and_mul_quantize(gate_up)),
                 (quantize_rows(normed), (fp8_rows.codes, fp8_rows.scale))]
        for (want_q, want_s), (q, s) in cases:
            if not (torch.equal(s, want_s) and torch.equal(q.view(torch.uint8),
                                                            want_q.view(torch.uint8))):
                logger.warning("FP8 activation quantization kernels disagree with the torch "
                               "ops: using the torch ops")
                fp8_quant.ENABLED = False
                break
    except Exception as exc:
        logger.warning("FP8 activation quantization kernels disabled: %r", exc)
        fp8_quant.ENABLED = False
    return fp8_quant.ENABLED


def check_decode_kernels(model: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """Checks the quantized GEMVs, the FP8 GEMM and activation quantization, that ``model``'s
    linear layers would run."""
    methods = [m.linear_method for m in model.modules() if isinstance(m, LinearBase)]
    bits = {m.scheme.bits for m in methods if isinstance(m, WNA16LinearMethod)}
    for b in sorted(bits):
        if decode_gemv_kernel(b) is not None:
            check_wna16_gemv(device, dtype, b)
    if any(isinstance(m, Fp8LinearMethod) for m in methods):
        check_fp8_gemv(device, dtype)
        check_fp8_gemm(device, dtype)
        check_fp8_quant(device, dtype)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
