"""Split-K FP8 W8A8 GEMM for decode batches of up to 512 rows: e4m3 activations with one fp32
scale per row (quantized before, by kernels/fp8_quant.py or by the norm, kernels/fp8_rows.py)
times an e4m3 [N, K] weight with one fp32 scale per output channel, + bias, in the activation's
dtype.

There ``torch._scaled_mm`` is bound by the serial K loop of too few programs, not by bytes or
FLOPs: on the H200 cuBLAS's 128 x 128 tiles give qkv and o_proj ~13.5 us at every M up to 256,
where their 17-19 MB of weights need ~3.8 us, and down ~35 us up to 128 rows (~12 us of bytes)
(BENCHMARKS.md, twenty-first session). Up to 8 rows the FP8 GEMV (kernels/fp8_gemv.py) takes a
layer where its TUNED keeps it (one row, on an H100), and this GEMM the rest. Here the K
chunks of a tile are split over SPLIT_K programs, as in the GEMVs (kernels/gemv.py): each writes
its fp32 partial, and the last of a tile's programs to finish sums them in split order
(deterministic) and writes the output. One launch, fixed workspaces per shape (the GEMVs'):
CUDA-graph safe.

A program computes a [BLOCK_N, BLOCK_M] tile as weight tile @ activation tile^T (both e4m3,
K-major, as Hopper's FP8 tensor cores take them): the weight rows fill the MMA's 64-row side
and the few activation rows its narrow side. Programs that share a weight tile run next to each
other (the M tiles of one N tile are consecutive), so the weights stream from DRAM once. The
products of e4m3 values are exact in fp32 and each BLOCK_K chunk's MMA is added to the fp32
accumulator on its own (``max_num_imprecise_acc``), as cuBLAS does without fast accumulation:
the W8A8 product ``_scaled_mm`` computes for a decode batch, up to summation order (a prompt's
rows, above ``fp8.FAST_ACCUM_ABOVE_ROWS``, take its fast accumulation instead).

``TUNED`` is keyed (rows bucket, N, K) and filled from scripts/gpu/fp8_gemm_sweep.py; a shape
not there, or None there, stays on ``_scaled_mm``. quantization/kernel_checks.py
compares the kernel with the W8A8 reference at start-up and sets ``ENABLED = False`` on a
problem.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from autoglm_serve.kernels import next_power_of_2, pdl
from autoglm_serve.kernels.gemv import finish_split_k, split_k_range, workspace
from autoglm_serve.kernels.pdl import let_dependents_launch, wait_for_previous_grid

ENABLED = True
MAX_ROWS = 512        # more: _scaled_mm's large tiles have programs enough
MIN_TILE_ROWS = 16    # the narrow side of an e4m3 MMA
DTYPES = (torch.bfloat16, torch.float16)


class GemmConfig(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3


# (rows bucket, N, K) -> config, or None: _scaled_mm was not 3% slower. AutoGLM-Phone-9B's
# shapes, from an H100 (scripts/gpu/fp8_gemm_sweep.py, 2026-12-05; no H200 was lent that hour):
# five configs, each within 3% of its shape's best (each distinct one compiles at start-up);
# each comment: this config's time, then _scaled_mm's (16 rows: also 2-8, whose times were
# within 3% of these, H100; the FP8 GEMV's and the quantization's beside them in
# kernels/fp8_gemv.py's TUNED). Up to 128 rows the split over K wins;
# from 256 rows the GEMMs are near the tensor cores' peak and cuBLAS's larger tiles do better.
TUNED: dict[tuple[int, int, int], GemmConfig | None] = {
    (16, 4608, 4096): GemmConfig(16, 64, 128, 4, 4, 4),  # qkv: 10.0 us, _scaled_mm 15.0
    (16, 4096, 4096): GemmConfig(16, 64, 128, 4, 4, 4),  # o_proj: 8.8 us, _scaled_mm 13.9
    (16, 27392, 4096): GemmConfig(16, 128, 256, 1, 4, 3),  # gate_up: 41.1 us, _scaled_mm 51.2
    (16, 4096, 13696): GemmConfig(16, 64, 128, 4, 4, 4),  # down: 23.5 us, _scaled_mm 41.9
    (32, 4608, 4096): GemmConfig(32, 64, 256, 2, 4, 3),  # qkv: 10.3 us, _scaled_mm 14.8
    (32, 4096, 4096): GemmConfig(32, 64, 256, 2, 4, 3),  # o_proj: 9.3 us, _scaled_mm 14.0
    (32, 27392, 4096): GemmConfig(16, 128, 256, 1, 4, 3),  # gate_up: 44.2 us, _scaled_mm 51.5
    (32, 4096, 13696): GemmConfig(16, 64, 128, 4, 4, 4),  # down: 24.5 us, _scaled_mm 39.1
    (64, 4608, 4096): GemmConfig(32, 64, 256, 2, 4, 3),  # qkv: 11.4 us, _scaled_mm 14.4
    (64, 4096, 4096): GemmConfig(32, 64, 256, 2, 4, 3),  # o_proj: 9.9 us, _scaled_mm 13.8
    (64, 27392, 4096): GemmConfig(64, 64, 256, 1, 4, 3),  # gate_up: 43.2 us, _scaled_mm 48.2
    (64, 4096, 13696): GemmConfig(32, 64, 256, 2, 4, 3),  # down: 26.6 us, _scaled_mm 35.8
    (128, 4608, 4096): GemmConfig(64, 64, 256, 1, 4, 3),  # qkv: 12.6 us, _scaled_mm 13.5
    (128, 4096, 4096): GemmConfig(64, 64, 256, 1, 4, 3),  # o_proj: 10.9 us, _scaled_mm 13.5
    (128, 27392, 4096): None,  # gate_up: 48.9 us, _scaled_mm 47.2
    (128, 4096, 13696): GemmConfig(64, 64, 256, 2, 4, 3),  # down: 29.7 us, _scaled_mm 34.6
    (256, 4608, 4096): None,  # qkv: 14.9 us, _scaled_mm 13.5
    (256, 4096, 4096): GemmConfig(64, 64, 256, 1, 4, 3),  # o_proj: 12.8 us, _scaled_mm 13.5
    (256, 27392, 4096): None,  # gate_up: 74.6 us, _scaled_mm 60.9
    (256, 4096, 13696): None,  # down: 38.2 us, _scaled_mm 38.1
    (512, 4608, 4096): None,  # qkv: 27.6 us, _scaled_mm 25.8
    (512, 4096, 4096): None,  # o_proj: 17.7 us, _scaled_mm 15.9
    (512, 27392, 4096): None,  # gate_up: 135.0 us, _scaled_mm 99.9
    (512, 4096, 13696): None,  # down: 54.0 us, _scaled_mm 42.9
}


def rows_bucket(m: int) -> int:
    """TUNED's rows key: the next power of two, at least the smallest activation tile (fewer
    rows run the same tiles, padded)."""
    return max(MIN_TILE_ROWS, next_power_of_2(m))


def select_config(m: int, n: int, k: int) -> GemmConfig | None:
    """The tuned config of this shape, or None (``_scaled_mm`` runs)."""
    if not 1 <= m <= MAX_ROWS:
        return None
    return TUNED.get((rows_bucket(m), n, k))


# M not specialized: Triton would compile a variant for row counts divisible by 16 (the decode
# graphs') and another for the rest (eager steps), the second while serving
@triton.jit(do_not_specialize=["M"])
def _fp8_gemm_kernel(x_ptr, xs_ptr, w_ptr, ws_ptr, bias_ptr, y_ptr, partial_ptr, count_ptr,
                     M, N, K, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                     EVEN_K: tl.constexpr, NUM_STAGES: tl.constexpr, PDL: tl.constexpr):
    """y[m, n] = sum_k x[m, k] w[n, k] * xs[m] * ws[n] (+ bias[n]). Program (t, s): tile t
    (M tiles of an N tile consecutive) and the s-th of SPLIT_K runs of K chunks."""
    tile = tl.program_id(0)
    pid_k = tl.program_id(1)
    tiles_m = tl.cdiv(M, BLOCK_M)
    pid_m = tile % tiles_m
    pid_n = tile // tiles_m
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # weight rows past N re-read row N - 1 and activation rows past M row M - 1: the loads
    # need no mask there, those results are dropped at the store
    rows = tl.minimum(offs_n, N - 1).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    x_rows = tl.minimum(offs_m, M - 1).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    w_tile = w_ptr + rows[:, None] * K + offs_k[None, :]
    x_tile = x_ptr + x_rows[:, None] * K + offs_k[None, :]

    k_start, k_end = split_k_range(pid_k, K, BLOCK_K, SPLIT_K)
    wait_for_previous_grid(PDL)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k in tl.range(k_start, k_end, BLOCK_K, num_stages=NUM_STAGES):
        if EVEN_K:
            w = tl.load(w_tile + k)
            x = tl.load(x_tile + k)
        else:
            k_mask = offs_k[None, :] < K - k
            w = tl.load(w_tile + k, mask=k_mask, other=0.0)
            x = tl.load(x_tile + k, mask=k_mask, other=0.0)
        acc = tl.dot(w, tl.trans(x), acc, max_num_imprecise_acc=BLOCK_K)
    let_dependents_launch(PDL)
    # scaled before the split-K reduction: linear, so each partial may be
    x_scale = tl.load(xs_ptr + x_rows)
    out = acc * tl.load(ws_ptr + rows)[:, None] * x_scale[None, :]
    finish_split_k(y_ptr, bias_ptr, partial_ptr, count_ptr, out, out, rows, offs_m, offs_n,
                   tile, pid_k, M, N, HAS_BIAS, False, SPLIT_K)


def supports(xq: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype) -> bool:
    """Whether ``fp8_gemm`` takes this product and was measured faster than ``_scaled_mm``."""
    if not ENABLED or not xq.is_cuda or out_dtype not in DTYPES or not weight.is_contiguous():
        return False
    n, k = weight.shape
    return xq.dim() == 2 and xq.shape[1] == k and select_config(xq.shape[0], n, k) is not None


def fp8_gemm(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
             weight_scale: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype,
             config: GemmConfig | None = None) -> torch.Tensor:
    """xq e4m3 [M, K] with float32 scales [M] (or [M, 1]), weight e4m3 [N, K] with float32
    scales [N], bias [N] or None -> [M, N] in ``out_dtype``."""
    m, k = xq.shape
    n = weight.shape[0]
    cfg = config or select_config(m, n, k)
    assert cfg is not None, f"no tuned FP8 GEMM for {m} x {n} x {k}"
    xq = xq.contiguous()
    y = torch.empty(m, n, dtype=out_dtype, device=xq.device)
    if m == 0:
        return y
    if cfg.split_k > 1:     # sized for the rows bucket: every row count in it shares one
        bucket = rows_bucket(m)
        tiles = triton.cdiv(bucket, cfg.block_m) * triton.cdiv(n, cfg.block_n)
        partials, counts = workspace(xq.device, n, tiles, cfg.split_k, False, rows=bucket)
    else:
        partials, counts = y, y   # unused
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), cfg.split_k)
    _fp8_gemm_kernel[grid](
        xq, x_scale, weight, weight_scale, bias if bias is not None else weight_scale, y,
        partials, counts, m, n, k, HAS_BIAS=bias is not None, BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
        EVEN_K=k % cfg.block_k == 0, NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps,
        **pdl.launch_options(xq.device))
    return y
