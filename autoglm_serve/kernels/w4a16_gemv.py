"""Decode GEMV for int4 weights with 16-bit activations (W4A16): y = x @ dequant(W)^T (+ bias)
for 1..MAX_ROWS activation rows, the GEMM kernels/wna16.py runs at prefill.

The weight is our packed layout (quantization/packing.py): int32 words along K, nibble j of a
word is input channel 8w + j, one scale (and optionally a uint8 zero) per group of input
channels. Decode reads each weight byte once per step, so the kernel is bandwidth-bound only if
the unpacking costs few instructions per weight; it is built like kernels/gemv.py (same
GemvConfig, same split-K with the deterministic last-program reduction, PDL, graph-safe
workspaces) with these changes:

- tiles are [BLOCK_N, BLOCK_K / 8, 8]: a program loads BLOCK_K / 8 contiguous words of each of
  its rows and the nibbles are split off along a third axis held in each thread's registers, so
  no reshape (a shared-memory round trip) happens on the one-row path;
- a nibble becomes a float with no int-to-float conversion (a slow instruction on the SMs):
  moved into a float's mantissa it is v = 1 + q * 2**-e, and one fma gives (q - zero) * scale *
  2**-e exactly; x is multiplied by 2**e instead (``_dequant``): ~4 instructions per weight
  with the accumulating fma, where the instruction issue rate, not HBM, would bound a kernel
  spending 6 or more;
- one row: products accumulated elementwise in fp32 and reduced once at the end (CUDA cores);
  2..MAX_ROWS rows: the dequantized bf16 tile reshaped for ``tl.dot`` (``dot=True``) or the
  rows multiplied on CUDA cores and reduced per tile (``dot=False``); the sweep picks.
- the gated variant (gate_up followed by SiLU-and-mul) loads rows n and I + n together.

``TUNED`` is keyed (kind, rows bucket, N, K, group) and filled by scripts/gpu/quant_gemv_bench.py;
None there means the prefill kernel (kernels/wna16.py) was faster, so it runs.
quantization/kernel_checks.py compares the kernel against dequantize-then-matmul at start-up
and sets ``ENABLED = False`` on a problem.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from autoglm_serve.kernels import pdl
from autoglm_serve.kernels.gemv import GemvConfig, finish_split_k, rows_bucket, workspace
from autoglm_serve.kernels.pdl import wait_for_previous_grid

ENABLED = True
MAX_ROWS = 8
DOT_MIN_ROWS = 16       # tl.dot's smallest tile side for 16-bit operands
DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# (kind, rows bucket, N, K, group) -> config (or None: kernels/wna16.py), from the H200.
TUNED: dict[tuple[str, int, int, int, int], GemvConfig | None] = {}


def default_config(m: int, n: int, k: int, group: int) -> GemvConfig:
    """Untuned: 256 bytes of packed weights per row per step, split-K up to ~256 programs."""
    block_k = 512
    block_n = 8 if m == 1 else 16
    tiles = triton.cdiv(n, block_n)
    split_k = 1
    while tiles * split_k < 256 and split_k < 8 and triton.cdiv(k, block_k) >= 4 * split_k:
        split_k *= 2
    return GemvConfig(block_n, block_k, split_k, num_warps=4, num_stages=3, dot=m > 1)


def _tuned_key(m, n, k, group, gated):
    return ("gated" if gated else "linear", rows_bucket(m), n, k, group)


def select_config(m: int, n: int, k: int, group: int, gated: bool = False) -> GemvConfig:
    return TUNED.get(_tuned_key(m, n, k, group, gated)) or default_config(m, n, k, group)


@triton.jit
def _dequant(q_ptrs, s_rows, z_rows, g, w_mask, HAS_ZEROS: tl.constexpr, ONE_GROUP: tl.constexpr):
    """[BLOCK_N, BLOCK_K / 8, 8] fp32 weights (q - zero) * scale * 2**-e[j] from BLOCK_K / 8
    packed words per row, exactly; the caller multiplies x by 2**e[j] (see ``_nibble_exponent``).

    Nibble j is moved to bits 12..15 (even j) or 16..19 (odd j) of a float's mantissa under the
    exponent of 1.0, making v = 1 + q * 2**-e with e = 11 or 7: one shift per two nibbles (the
    word is shifted by 12, 4, -4 or -12) and one and-or per nibble, no int-to-float conversion.
    Then fma(v, s, -(1 + z * 2**-e) * s) = (q - z) * s * 2**-e, exact for 16-bit scales: every
    product has at most 12 + 11 significant bits, so nothing rounds (fp32 scales: ~1e-5)."""
    j = tl.arange(0, 8)[None, None, :]
    p = tl.load(q_ptrs, mask=w_mask[None, :], other=0)[:, :, None]
    moved = tl.where(j < 2, p << 12, tl.where(j < 4, p << 4, tl.where(j < 6, p >> 4, p >> 12)))
    bits = (moved & tl.where(j % 2 == 0, 0xF000, 0xF0000)) | 0x3F800000
    v = bits.to(tl.float32, bitcast=True)
    if ONE_GROUP:    # the whole tile lies in group g of each row
        s = tl.load(s_rows + g).to(tl.float32)[:, None, None]
        if HAS_ZEROS:
            z = tl.load(z_rows + g).to(tl.float32)[:, None, None]
    else:            # g: the group of each word
        s = tl.load(s_rows[:, None] + g[None, :]).to(tl.float32)[:, :, None]
        if HAS_ZEROS:
            z = tl.load(z_rows[:, None] + g[None, :]).to(tl.float32)[:, :, None]
    if not HAS_ZEROS:
        z = 8.0
    c = 1.0 + z * tl.where(j % 2 == 0, 1.0 / 2048.0, 1.0 / 128.0)
    return tl.fma(v, s, -(c * s))


@triton.jit
def _nibble_exponent():
    """2**e[j] for the 8 nibbles of a word (the scale ``_dequant`` leaves on the weights)."""
    j = tl.arange(0, 8)[None, None, :]
    return tl.where(j % 2 == 0, 2048.0, 128.0)


@triton.jit
def _accumulate(acc, w, x, USE_DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr):
    """acc += w x^T for w from ``_dequant`` (scaled by 2**-e) and the x tile as loaded."""
    xs = x.to(tl.float32) * _nibble_exponent()      # exact: powers of two
    if USE_DOT:
        # rounding w * 2**-e to 16 bits is rounding w (a power-of-two scale commutes)
        wt = tl.reshape(w.to(x.dtype), (BLOCK_N, BLOCK_K))
        xt = tl.trans(tl.reshape(xs.to(x.dtype), (BLOCK_M, BLOCK_K)))
        acc = tl.dot(wt, xt, acc, input_precision="ieee")
    elif BLOCK_M == 1:
        acc += w * xs                        # [BN, BW, 8] * [1, BW, 8]
    else:
        prod = w[:, None, :, :] * xs[None, :, :, :]
        acc += tl.sum(tl.sum(prod, axis=3), axis=2)
    return acc


@triton.jit
def _w4a16_gemv_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, bias_ptr, y_ptr, partial_ptr, count_ptr,
                       M, N, K, GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr,
                       HAS_BIAS: tl.constexpr, GATED: tl.constexpr, USE_DOT: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       SPLIT_K: tl.constexpr, NUM_STAGES: tl.constexpr, PDL: tl.constexpr):
    """y[m, n] = sum_k x[m, k] dequant(w)[n, k]; program (i, s) owns BLOCK_N features and the
    s-th of SPLIT_K runs of K chunks. GATED: 2N weight rows, y = silu(x @ w[:N]^T) * (x @ w[N:]^T)."""
    BW: tl.constexpr = BLOCK_K // 8
    ONE_GROUP: tl.constexpr = GROUP % BLOCK_K == 0
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(offs_n, N - 1).to(tl.int64)   # rows past N re-read row N - 1, dropped
    offs_m = tl.arange(0, BLOCK_M)
    offs_w = tl.arange(0, BW)
    words = K // 8
    groups = K // GROUP
    q_gate = qw_ptr + rows[:, None] * words + offs_w[None, :]
    q_up = qw_ptr + (rows + N)[:, None] * words + offs_w[None, :]
    s_gate = s_ptr + rows * groups
    s_up = s_ptr + (rows + N) * groups
    z_gate = z_ptr + rows * groups
    z_up = z_ptr + (rows + N) * groups
    # x[m, 8w + j] as a [BLOCK_M, BW, 8] tile, the weight tile's shape
    x_tile = (x_ptr + offs_m[:, None, None] * K + (offs_w * 8)[None, :, None]
              + tl.arange(0, 8)[None, None, :])
    m_mask = offs_m[:, None, None] < M

    chunks_per_split = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K)
    k_start = pid_k * chunks_per_split * BLOCK_K
    k_end = tl.minimum(k_start + chunks_per_split * BLOCK_K, K)
    wait_for_previous_grid(PDL)
    if USE_DOT or BLOCK_M > 1:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_N, BW, 8), dtype=tl.float32)
    acc_up = tl.zeros_like(acc)
    for k in tl.range(k_start, k_end, BLOCK_K, num_stages=NUM_STAGES):
        w_mask = offs_w < words - k // 8
        x = tl.load(x_tile + k, mask=m_mask & w_mask[None, :, None], other=0.0)
        if ONE_GROUP:
            g = k // GROUP
        else:    # masked words past K would name a group past the last: clamp (x is 0 there)
            g = tl.minimum((k + offs_w * 8) // GROUP, groups - 1)
        w = _dequant(q_gate + k // 8, s_gate, z_gate, g, w_mask, HAS_ZEROS, ONE_GROUP)
        acc = _accumulate(acc, w, x, USE_DOT, BLOCK_M, BLOCK_N, BLOCK_K)
        if GATED:
            w2 = _dequant(q_up + k // 8, s_up, z_up, g, w_mask, HAS_ZEROS, ONE_GROUP)
            acc_up = _accumulate(acc_up, w2, x, USE_DOT, BLOCK_M, BLOCK_N, BLOCK_K)
    if USE_DOT or BLOCK_M > 1:
        out = acc
        out_up = acc_up
    else:   # one row: one cross-K reduction for the whole loop
        out = tl.sum(tl.sum(acc, axis=2), axis=1, keep_dims=True)
        out_up = tl.sum(tl.sum(acc_up, axis=2), axis=1, keep_dims=True)
    finish_split_k(y_ptr, bias_ptr, partial_ptr, count_ptr, out, out_up, rows, offs_m, offs_n,
                   pid_n, pid_k, M, N, HAS_BIAS, GATED, SPLIT_K)


def supports(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bits: int,
             group: int, bias: torch.Tensor | None = None, gated: bool = False) -> bool:
    """Whether the GEMV handles this call and is not slower than kernels/wna16.py where
    measured."""
    if not ENABLED or bits != 4 or x.dtype not in DTYPES or not x.is_cuda:
        return False
    k = x.shape[-1]
    if k == 0 or qweight.shape[1] * 8 != k or k % group or group % 8:
        return False
    if not (qweight.is_contiguous() and scales.is_contiguous()):
        return False
    m = x.numel() // k
    if not 1 <= m <= MAX_ROWS:
        return False
    n = qweight.shape[0] // 2 if gated else qweight.shape[0]
    if gated and (qweight.shape[0] % 2 or bias is not None):
        return False
    key = _tuned_key(m, n, k, group, gated)
    return key not in TUNED or TUNED[key] is not None


def _launch(x, qweight, scales, zeros, group, bias, n, gated, config):
    k = x.shape[-1]
    x2 = x.reshape(-1, k).contiguous()
    m = x2.shape[0]
    assert 1 <= m <= MAX_ROWS, f"{m} rows: the GEMV handles 1..{MAX_ROWS}"
    cfg = config or select_config(m, n, k, group, gated)
    assert cfg.block_k % 8 == 0 and cfg.block_k >= 16
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    tiles = triton.cdiv(n, cfg.block_n)
    if cfg.split_k > 1:
        partials, counts = workspace(x.device, n, tiles, cfg.split_k, gated)
    else:
        partials, counts = y, y   # unused
    block_m = max(DOT_MIN_ROWS, triton.next_power_of_2(m)) if cfg.dot \
        else triton.next_power_of_2(m)
    _w4a16_gemv_kernel[(tiles, cfg.split_k)](
        x2, qweight, scales, zeros if zeros is not None else scales,
        bias if bias is not None else scales, y, partials, counts, m, n, k,
        GROUP=group, HAS_ZEROS=zeros is not None, HAS_BIAS=bias is not None, GATED=gated,
        USE_DOT=cfg.dot, BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        SPLIT_K=cfg.split_k, NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps,
        **pdl.launch_options(x.device))
    return y.view(*x.shape[:-1], n)


def w4a16_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
               zeros: torch.Tensor | None, group: int, bias: torch.Tensor | None = None,
               config: GemvConfig | None = None) -> torch.Tensor:
    """x [..., K] (<= MAX_ROWS rows), qweight int32 [N, K / 8], scales [N, K / group], zeros
    uint8 [N, K / group] or None (symmetric: 8) -> [..., N] in x's dtype."""
    return _launch(x, qweight, scales, zeros, group, bias, qweight.shape[0], False, config)


def w4a16_gated_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                     zeros: torch.Tensor | None, group: int,
                     config: GemvConfig | None = None) -> torch.Tensor:
    """silu(x @ gate^T) * (x @ up^T) for a packed [gate; up] weight of 2I rows -> [..., I]."""
    assert qweight.shape[0] % 2 == 0
    return _launch(x, qweight, scales, zeros, group, None, qweight.shape[0] // 2, True, config)
