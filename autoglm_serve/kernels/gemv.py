"""Matrix-vector kernels for decode: y = x @ W^T (+ bias) when x has only a few rows.

At decode the GEMMs read every weight once per step for 1..16 activation rows, so they are bound
by HBM bandwidth, and cuBLAS reaches ~3.5 TB/s on them where an H200 can stream ~4.3. Here a
program owns
BLOCK_N output features and streams their weight rows in [BLOCK_N, BLOCK_K] tiles, pipelined
``num_stages`` deep, with fp32 accumulation:

- one row (M = 1), unless the tuned config says ``dot``: on CUDA cores, products accumulated
  elementwise in a [BLOCK_N, BLOCK_K] fp32 tile and reduced across K once at the end, so the
  loop body is loads and FMAs only;
- 2..MAX_ROWS rows: ``tl.dot`` of the weight tile against x^T padded to 8 rows; the padding
  costs tensor-core cycles, which are idle here anyway, and each weight tile serves every row.

Split-K gives N = 4096 shapes enough programs for the 132 SMs with wide tiles: the K chunks are
split over SPLIT_K programs per tile, each writes its fp32 partial to a workspace, and the last
to finish (a per-tile counter) sums the partials in split order and writes the output. That is
one launch, deterministic (the sum order never depends on which program finishes last), and
graph-safe: the workspace is allocated once per shape and the counter is reset by the reducer.

The gated variant computes silu(x @ gate^T) * (x @ up^T) for a [gate; up] weight of 2I rows:
a program loads rows n and I + n together, so the [M, 2I] projection is never written. Rounding
points match the PyTorch path (gate and up rounded to the activation dtype, silu in fp32 then
rounded, product in fp32 then rounded).

Launched with programmatic dependent launch (kernels/pdl.py) on Hopper: the launch is prepared
while the kernel before it runs. (Prefetching each program's first weight lines into L2 before
its wait was measured too, and lost: 185 against 189.5 tok/s at batch 1, both with dependents
signalled early.)

Launch parameters depend only on (M, N, K, dtype) so CUDA graphs can capture the launches;
``select_config`` reads ``TUNED`` (filled from ``scripts/gpu/gemv_bench.py`` on the H200) and falls
back to ``default_config``. ``self_check`` compares against PyTorch at start-up and switches the
kernels off (``ENABLED``) on any problem.
"""
from __future__ import annotations

import logging
from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from autoglm_serve.kernels import next_power_of_2, pdl
from autoglm_serve.kernels.pdl import let_dependents_launch, wait_for_previous_grid

logger = logging.getLogger(__name__)

ENABLED = True
MAX_ROWS = 16         # the decode CUDA graphs' batch sizes 1, 2, 4, 8, 16; beyond, cuBLAS
DOT_MIN_ROWS = 8      # x^T tile width for tl.dot (tensor cores pad smaller tiles anyway)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class GemvConfig(NamedTuple):
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    dot: bool = False     # tensor cores; required for more than one row
    # CUDA cores, one row: words a 16-bit pair sum; W4A16 with bf16 activations in bf16 pairs
    # (1, 2), FP8 in f16 pairs (1, 2, 4)
    packed: int = 0


# (kind, rows bucket, N, K) -> config, for 16-bit weights. kind is "linear" or "gated" (N is
# then I, the weight has 2I rows); the bucket is the next power of two >= M. None: cuBLAS was
# faster there, so F.linear runs. The table scripts/gpu/gemv_bench.py prints, from the H200
# (bf16, 2026-11-29) at AutoGLM-Phone-9B's shapes; each comment: the GEMV's time, then cuBLAS's
# (plus the separate SiLU kernel for "gated").
TUNED: dict[tuple[str, int, int, int], GemvConfig | None] = {
    ('gated', 1, 13696, 4096): GemvConfig(8, 512, 1, 4, 6, False),  # 53.9 us, cuBLAS + SiLU 57.9
    ('gated', 2, 13696, 4096): GemvConfig(64, 128, 1, 8, 3, True),  # 54.7 us, cuBLAS + SiLU 57.4
    ('gated', 4, 13696, 4096): GemvConfig(64, 128, 1, 4, 3, True),  # 54.6 us, cuBLAS + SiLU 58.2
    ('gated', 8, 13696, 4096): GemvConfig(64, 128, 1, 4, 3, True),  # 55.0 us, cuBLAS + SiLU 58.2
    ('linear', 1, 4096, 13696): GemvConfig(16, 512, 1, 4, 4, False),  # 28.0 us, cuBLAS 30.7
    ('linear', 2, 4096, 13696): GemvConfig(64, 128, 4, 4, 4, True),  # 29.3 us, cuBLAS 30.6
    ('linear', 4, 4096, 13696): GemvConfig(64, 128, 4, 4, 4, True),  # 29.7 us, cuBLAS 30.5
    ('linear', 8, 4096, 13696): GemvConfig(64, 128, 4, 4, 4, True),  # 29.9 us, cuBLAS 30.6
    ('linear', 1, 151552, 4096): GemvConfig(16, 256, 1, 4, 3, False),  # 277.7 us, cuBLAS 297.1
    ('linear', 2, 151552, 4096): GemvConfig(64, 256, 1, 4, 2, True),  # 279.1 us, cuBLAS 297.9
    ('linear', 4, 151552, 4096): GemvConfig(64, 256, 1, 4, 3, True),  # 282.1 us, cuBLAS 300.6
    ('linear', 8, 151552, 4096): GemvConfig(64, 256, 1, 4, 2, True),  # 283.6 us, cuBLAS 301.4
    ('linear', 1, 4608, 4096): GemvConfig(4, 256, 1, 4, 4, False),  # 11.6 us, cuBLAS 14.0
    ('linear', 2, 4608, 4096): GemvConfig(64, 128, 2, 4, 4, True),  # 12.9 us, cuBLAS 14.1
    ('linear', 4, 4608, 4096): GemvConfig(64, 128, 2, 4, 4, True),  # 12.9 us, cuBLAS 14.0
    ('linear', 8, 4608, 4096): GemvConfig(32, 128, 2, 4, 4, True),  # 12.9 us, cuBLAS 13.9
    ('linear', 1, 4096, 4096): GemvConfig(8, 256, 1, 4, 4, False),  # 10.1 us, cuBLAS 12.3
    ('linear', 2, 4096, 4096): GemvConfig(64, 128, 4, 4, 3, True),  # 11.0 us, cuBLAS 12.4
    ('linear', 4, 4096, 4096): GemvConfig(64, 128, 4, 4, 3, True),  # 11.2 us, cuBLAS 12.5
    ('linear', 8, 4096, 4096): GemvConfig(64, 128, 4, 4, 4, True),  # 11.2 us, cuBLAS 12.4
    # 16 rows (2026-12-03, `--ms 16`): the decode step's GEMMs 4.95 ms on cuBLAS, 4.61 here
    ('gated', 16, 13696, 4096): GemvConfig(64, 128, 1, 4, 3, True),  # 55.4 us, cuBLAS + SiLU 62.2
    ('linear', 16, 4096, 13696): GemvConfig(64, 256, 2, 4, 4, True),  # 29.6 us, cuBLAS 31.1
    ('linear', 16, 151552, 4096): GemvConfig(128, 128, 1, 8, 2, True),  # 283.0 us, cuBLAS 302.3
    ('linear', 16, 4608, 4096): None,  # 12.5 us, cuBLAS 12.4
    ('linear', 16, 4096, 4096): GemvConfig(64, 128, 2, 4, 6, True),  # 10.8 us, cuBLAS 12.6
}


def rows_bucket(m: int) -> int:
    return next_power_of_2(m)


def default_config(m: int, n: int, k: int, dtype: torch.dtype) -> GemvConfig:
    """Untuned choice: 512 bytes of each weight row per step, and split-K up to 256 programs
    (two per SM of an H200) where the tiles of N alone are fewer."""
    block_k = 512 // dtype.itemsize
    if m == 1:
        block_n = 16 if n >= 16 * 512 else 8
    else:
        block_n = 16
    split_k = default_split_k(triton.cdiv(n, block_n), triton.cdiv(k, block_k), 8)
    return GemvConfig(block_n, block_k, split_k, num_warps=4, num_stages=3, dot=m > 1)


def default_split_k(tiles: int, k_chunks: int, min_chunks_per_split: int) -> int:
    """The untuned split-K of the GEMVs here and in the quantized ones: doubled (up to 8) while
    the tiles give fewer than 256 programs and each split keeps ``min_chunks_per_split`` chunks."""
    split_k = 1
    while tiles * split_k < 256 and split_k < 8 and k_chunks >= min_chunks_per_split * split_k:
        split_k *= 2
    return split_k


def _tuned_key(m: int, n: int, k: int, dtype: torch.dtype, gated: bool):
    if dtype == torch.float32:    # the table is measured on 16-bit weights
        return None
    return ("gated" if gated else "linear", rows_bucket(m), n, k)


def select_config(m: int, n: int, k: int, dtype: torch.dtype, gated: bool = False) -> GemvConfig:
    return TUNED.get(_tuned_key(m, n, k, dtype, gated)) or default_config(m, n, k, dtype)


@triton.jit
def _write_output(y_ptr, bias_ptr, out, out_up, rows, y_offs, y_mask,
                  HAS_BIAS: tl.constexpr, GATED: tl.constexpr):
    dtype = y_ptr.dtype.element_ty
    if GATED:
        gate = out.to(dtype).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(dtype)
        res = act.to(tl.float32) * out_up.to(dtype).to(tl.float32)
    else:
        res = out
        if HAS_BIAS:
            res += tl.load(bias_ptr + rows).to(tl.float32)[:, None]
    tl.store(y_ptr + y_offs, res.to(dtype), mask=y_mask)


@triton.jit
def row_tiles(x_ptr, w_ptr, pid_n, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr):
    """Program pid_n's offsets, weight rows and first-tile pointers for a row-major [N, K]
    weight (GATED: [2N, K], up rows at N + n) and x [M, K]: (offs_n, rows, offs_m, offs_k,
    w_gate, w_up, x_tile, m_mask). Shared by the FP8 GEMV."""
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # rows past N re-read row N - 1: the weight loads need no mask, those results are dropped
    rows = tl.minimum(offs_n, N - 1).to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    w_gate = w_ptr + rows[:, None] * K + offs_k[None, :]
    w_up = w_ptr + (rows + N)[:, None] * K + offs_k[None, :]
    x_tile = x_ptr + offs_m[:, None] * K + offs_k[None, :]
    m_mask = offs_m[:, None] < M
    return offs_n, rows, offs_m, offs_k, w_gate, w_up, x_tile, m_mask


@triton.jit
def zero_accumulators(USE_DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr):
    """fp32 (gate, up) accumulators: [BLOCK_N, BLOCK_M] for tl.dot, else [BLOCK_N, BLOCK_K]
    (one row, products summed elementwise and reduced across K once, after the loop)."""
    if USE_DOT:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    return acc, tl.zeros_like(acc)


@triton.jit
def reduce_accumulators(acc, acc_up, USE_DOT: tl.constexpr):
    """The [BLOCK_N, BLOCK_M] results of ``zero_accumulators``' tiles."""
    if USE_DOT:
        out = acc
        out_up = acc_up
    else:   # BLOCK_M == 1: one cross-K reduction for the whole loop
        out = tl.sum(acc, axis=1, keep_dims=True)
        out_up = tl.sum(acc_up, axis=1, keep_dims=True)
    return out, out_up


@triton.jit
def bf16_lanes(v):
    """The low and high bf16 of each uint32 as fp32 (exact: a bf16 is an fp32's top half).
    Shared by the quantized GEMVs' 16-bit pair paths."""
    lo = (v << 16).to(tl.float32, bitcast=True)
    hi = (v & 0xFFFF0000).to(tl.float32, bitcast=True)
    return lo, hi


@triton.jit
def f16_lanes(v):
    """The low and high f16 of each uint32 as fp32. Shared as ``bf16_lanes``."""
    lo = (v & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    hi = (v >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def halves(v):
    """The even and odd entries along the last axis of a 2-D or 3-D tensor, each half as wide.
    Shared by the quantized GEMVs' paths that sum adjacent words."""
    if len(v.shape) == 2:
        out = tl.split(tl.reshape(v, (v.shape[0], v.shape[1] // 2, 2)))
    else:
        out = tl.split(tl.reshape(v, (v.shape[0], v.shape[1], v.shape[2] // 2, 2)))
    return out


@triton.jit
def split_k_range(pid_k, K, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """[k_start, k_end) of program pid_k: the s-th of SPLIT_K runs of equally many K chunks.
    Shared by the quantized GEMVs."""
    chunks_per_split = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K)
    k_start = pid_k * chunks_per_split * BLOCK_K
    k_end = tl.minimum(k_start + chunks_per_split * BLOCK_K, K)
    return k_start, k_end


@triton.jit
def load_k_tile(x_tile, w_gate, w_up, k, offs_k, m_mask, K, GATED: tl.constexpr,
                EVEN_K: tl.constexpr):
    """(x, gate weight, up weight) tiles at K offset k, masked past K unless EVEN_K; without
    GATED the up tile is the gate's (unused). Shared by the FP8 GEMV."""
    if EVEN_K:
        x = tl.load(x_tile + k, mask=m_mask, other=0.0)
        w = tl.load(w_gate + k)
        w2 = w
        if GATED:
            w2 = tl.load(w_up + k)
    else:
        k_mask = offs_k[None, :] < K - k
        x = tl.load(x_tile + k, mask=m_mask & k_mask, other=0.0)
        w = tl.load(w_gate + k, mask=k_mask, other=0.0)
        w2 = w
        if GATED:
            w2 = tl.load(w_up + k, mask=k_mask, other=0.0)
    return x, w, w2


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, partial_ptr, count_ptr, M, N, K,
                 HAS_BIAS: tl.constexpr, GATED: tl.constexpr, USE_DOT: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, NUM_STAGES: tl.constexpr,
                 PDL: tl.constexpr):
    """y[m, n] = sum_k x[m, k] w[n, k]. Program (i, s) owns features [i, i + 1) * BLOCK_N and
    the s-th of SPLIT_K runs of K chunks. GATED: w has 2N rows and
    y = silu(x @ w[:N]^T) * (x @ w[N:]^T)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n, rows, offs_m, offs_k, w_gate, w_up, x_tile, m_mask = row_tiles(
        x_ptr, w_ptr, pid_n, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)

    k_start, k_end = split_k_range(pid_k, K, BLOCK_K, SPLIT_K)
    wait_for_previous_grid(PDL)
    acc, acc_up = zero_accumulators(USE_DOT, BLOCK_M, BLOCK_N, BLOCK_K)
    # num_stages on the loop itself: Triton then pipelines loads that feed no tl.dot (one row)
    for k in tl.range(k_start, k_end, BLOCK_K, num_stages=NUM_STAGES):
        x, w, w2 = load_k_tile(x_tile, w_gate, w_up, k, offs_k, m_mask, K, GATED, EVEN_K)
        if USE_DOT:
            xt = tl.trans(x)
            acc = tl.dot(w, xt, acc, input_precision="ieee")
            if GATED:
                acc_up = tl.dot(w2, xt, acc_up, input_precision="ieee")
        else:
            xf = x.to(tl.float32)
            acc += w.to(tl.float32) * xf
            if GATED:
                acc_up += w2.to(tl.float32) * xf
    let_dependents_launch(PDL)
    out, out_up = reduce_accumulators(acc, acc_up, USE_DOT)
    finish_split_k(y_ptr, bias_ptr, partial_ptr, count_ptr, out, out_up, rows, offs_m, offs_n,
                   pid_n, pid_k, M, N, HAS_BIAS, GATED, SPLIT_K)


@triton.jit
def finish_split_k(y_ptr, bias_ptr, partial_ptr, count_ptr, out, out_up, rows, offs_m, offs_n,
                   pid_n, pid_k, M, N, HAS_BIAS: tl.constexpr, GATED: tl.constexpr,
                   SPLIT_K: tl.constexpr):
    """Writes a program's [BLOCK_N, BLOCK_M] fp32 result (+ bias, or the SiLU gating): directly
    without split-K, else as a partial; the last of a tile's SPLIT_K programs sums the partials
    in split order (deterministic) and writes. Shared by the quantized GEMVs."""
    y_offs = offs_m[None, :] * N + offs_n[:, None]
    y_mask = (offs_n[:, None] < N) & (offs_m[None, :] < M)
    if SPLIT_K == 1:
        _write_output(y_ptr, bias_ptr, out, out_up, rows, y_offs, y_mask, HAS_BIAS, GATED)
    else:
        split_stride = (2 if GATED else 1) * M * N
        tl.store(partial_ptr + pid_k * split_stride + y_offs, out, mask=y_mask)
        if GATED:
            tl.store(partial_ptr + pid_k * split_stride + M * N + y_offs, out_up, mask=y_mask)
        # every thread's partial is issued before one thread publishes it (release, GPU scope)
        tl.debug_barrier()
        arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            total = tl.zeros_like(out)
            total_up = tl.zeros_like(out_up)
            for s in tl.static_range(SPLIT_K):
                # .cg: read from L2, where the other programs' partials are
                total += tl.load(partial_ptr + s * split_stride + y_offs, mask=y_mask, other=0.0,
                                 cache_modifier=".cg")
                if GATED:
                    total_up += tl.load(partial_ptr + s * split_stride + M * N + y_offs,
                                        mask=y_mask, other=0.0, cache_modifier=".cg")
            _write_output(y_ptr, bias_ptr, total, total_up, rows, y_offs, y_mask, HAS_BIAS,
                          GATED)
            tl.store(count_ptr + pid_n, 0)   # ready for the next launch (graph replays too)


# (device, N, tiles, split_k, gated, rows) -> (fp32 partials, int32 counters). Allocated once
# per shape and never replaced: a captured CUDA graph keeps pointing at them. Shared by the
# quantized GEMVs and the FP8 GEMM (kernels/fp8_gemm.py, up to its rows bucket).
_workspaces: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def workspace(device, n: int, tiles: int, split_k: int, gated: bool, rows: int = MAX_ROWS):
    """finish_split_k's partials for up to ``rows`` rows, and its per-tile counters."""
    key = (device, n, tiles, split_k, gated, rows)
    if key not in _workspaces:
        partials = torch.empty(split_k * (2 if gated else 1) * rows * n, dtype=torch.float32,
                               device=device)
        _workspaces[key] = (partials, torch.zeros(tiles, dtype=torch.int32, device=device))
    return _workspaces[key]


def as_rows(x: torch.Tensor, k: int, max_rows: int) -> torch.Tensor:
    """x [..., K] as contiguous [M, K] rows, 1 <= M <= max_rows."""
    x2 = x.reshape(-1, k).contiguous()
    m = x2.shape[0]
    assert 1 <= m <= max_rows, f"{m} rows: the GEMV handles 1..{max_rows}"
    return x2


def as_int32_pairs(x2: torch.Tensor) -> torch.Tensor:
    """Contiguous 16-bit rows [M, K] as int32 pairs [M, K / 2], for the GEMVs' 16-bit pair
    paths; a view at an odd element (no int32 view of it) is copied first."""
    if x2.storage_offset() % 2:
        x2 = x2.clone()
    return x2.view(torch.int32)


def launch_buffers(x: torch.Tensor, m: int, n: int, cfg: GemvConfig, gated: bool,
                   max_rows: int = MAX_ROWS):
    """(y [m, n], tiles of N, split-K partials for up to ``max_rows`` rows, counters) of one
    launch; without split-K the kernel takes y in place of the (unused) workspace."""
    assert m <= max_rows
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    tiles = triton.cdiv(n, cfg.block_n)
    if cfg.split_k > 1:
        partials, counts = workspace(x.device, n, tiles, cfg.split_k, gated, max_rows)
    else:
        partials, counts = y, y   # unused
    return y, tiles, partials, counts


def supports(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
             gated: bool = False) -> bool:
    """Whether ``gemv(x, weight, bias)`` (``gated_gemv(x, weight)``) handles these tensors and is
    not slower than cuBLAS on them where measured; else use F.linear."""
    if weight.dim() != 2 or not weight.is_contiguous() or x.dtype != weight.dtype:
        return False
    n, k = weight.shape
    if x.dtype not in DTYPES or x.dim() == 0 or x.shape[-1] != k or k == 0:
        return False
    m = x.numel() // k
    if not 1 <= m <= MAX_ROWS or x.device != weight.device:
        return False
    if bias is not None and not (bias.dtype == x.dtype and bias.shape == (n,)
                                 and bias.is_contiguous()):
        return False
    if gated and (n % 2 or bias is not None):
        return False
    key = _tuned_key(m, n // 2 if gated else n, k, x.dtype, gated)
    return key not in TUNED or TUNED[key] is not None


def _launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, n: int,
            gated: bool, config: GemvConfig | None) -> torch.Tensor:
    k = weight.shape[1]
    x2 = as_rows(x, k, MAX_ROWS)
    m = x2.shape[0]
    cfg = config or select_config(m, n, k, x.dtype, gated)
    assert cfg.dot or m == 1, "the CUDA-core path computes one row; more need dot=True"
    y, tiles, partials, counts = launch_buffers(x, m, n, cfg, gated)
    _gemv_kernel[(tiles, cfg.split_k)](
        x2, weight, bias if bias is not None else weight, y, partials, counts, m, n, k,
        HAS_BIAS=bias is not None, GATED=gated, USE_DOT=cfg.dot,
        BLOCK_M=max(DOT_MIN_ROWS, next_power_of_2(m)) if cfg.dot else 1,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
        EVEN_K=k % cfg.block_k == 0, NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps,
        **pdl.launch_options(x.device))
    return y.view(*x.shape[:-1], n)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         config: GemvConfig | None = None) -> torch.Tensor:
    """x [..., K] (at most MAX_ROWS rows) @ weight[N, K]^T + bias -> [..., N] in x's dtype."""
    return _launch(x, weight, bias, weight.shape[0], False, config)


def gated_gemv(x: torch.Tensor, weight: torch.Tensor,
               config: GemvConfig | None = None) -> torch.Tensor:
    """silu(x @ gate^T) * (x @ up^T) for weight = [gate; up] of [2I, K] -> [..., I]."""
    assert weight.shape[0] % 2 == 0
    return _launch(x, weight, None, weight.shape[0] // 2, True, config)


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
              gated: bool = False) -> torch.Tensor:
    """The PyTorch computation the kernel replaces."""
    if not gated:
        return F.linear(x, weight, bias)
    gate, up = F.linear(x, weight).chunk(2, dim=-1)
    return F.silu(gate) * up


def _check_cases(device, dtype):
    """(name, x, weight, bias, gated, config): every kernel path once on small shapes, then every
    tuned config at its own rows and K."""
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=dtype)

    cases = []
    for m in (1, 3):
        split = GemvConfig(32, 512 // dtype.itemsize, split_k=4, dot=m > 1)
        x, w, b, gate_up = rand(m, 1024), rand(100, 1024), rand(100), rand(2 * 72, 1024)
        cases += [(f"{m} rows, bias", x, w, b, False, None),
                  (f"{m} rows, K not a multiple of the tile", rand(m, 1000), rand(100, 1000), None,
                   False, None),
                  (f"{m} rows, split-K", x, w, b, False, split),
                  (f"{m} rows, gated", x, gate_up, None, True, None),
                  (f"{m} rows, gated split-K", x, gate_up, None, True, split)]
    if dtype != torch.float32:
        for (kind, m, n, k), cfg, rows in tuned_check_shapes(TUNED):
            cases.append((f"tuned {kind} {m}x{n}x{k}", rand(m, k), rand(rows, k), None,
                          kind == "gated", cfg))
    return cases


def tuned_check_shapes(table):
    """(key, config, weight rows) of each config of a TUNED table here or in the quantized
    GEMVs (None: cuBLAS runs there, skipped), the rows cut to two tiles of N and a partial
    one; the key's M and K stay. key = (kind, M, N, K, ...)."""
    for key, cfg in table.items():
        if cfg is not None:
            n_small = min(key[2], 2 * cfg.block_n + 3)
            yield key, cfg, 2 * n_small if key[0] == "gated" else n_small


def self_check(device: torch.device, dtype: torch.dtype) -> bool:
    """Runs each kernel path (and every tuned config) once against PyTorch; on a failure or a
    disagreement sets ``ENABLED = False`` so linear layers use F.linear. Returns ``ENABLED``."""
    global ENABLED
    if dtype not in DTYPES:
        return ENABLED
    try:
        for name, x, weight, bias, gated, cfg in _check_cases(device, dtype):
            got = gated_gemv(x, weight, cfg) if gated else gemv(x, weight, bias, cfg)
            want = reference(x, weight, bias, gated).float()
            err = ((got.float() - want).norm() / want.norm().clamp_min(1e-6)).item()
            if not err < 2e-2:
                logger.warning("GEMV kernel disagrees with PyTorch (%s: relative error %.3g): "
                               "using F.linear", name, err)
                ENABLED = False
                break
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:   # a compile or launch failure: F.linear instead
        logger.warning("GEMV kernel disabled: %r", exc)
        ENABLED = False
    return ENABLED
