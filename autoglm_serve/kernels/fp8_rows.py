"""Per-token e4m3 codes of activation rows, made as quantization/fp8.quantize_rows makes them:
scale = max(row amax / 448, 1e-12), code = saturate(x / scale) with IEEE divisions (Triton's
``/`` is approximate), so every kernel that quantizes a row decides the same codes as the torch
ops. Shared by kernels/fp8_quant.py's kernels, the fused norm of kernels/fused_ops.py and the
FP8 GEMV.

``Fp8Rows`` is a norm's output handed to an FP8 layer already quantized: GLM-4's norm pair has
each row in registers, so it writes the codes, the scales and the amax on the way, and the
layer after it runs no quantization kernel of its own (vLLM fuses RMSNorm with its per-token
FP8 quantization the same way).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

FP8 = torch.float8_e4m3fn
FP8_MAX = tl.constexpr(448.0)       # constexpr: a global the kernels read
MIN_SCALE = tl.constexpr(1e-12)     # as quantization/fp8.py: an all-zero row gets codes 0


class Fp8Rows(NamedTuple):
    """Rows [M, K] as an FP8 layer takes them: e4m3 codes [M, K], float32 scales [M, 1], and
    each row's max |x| [M]. One row has no codes (None): the FP8 GEMV takes it in 16 bits and
    quantizes it in its K loop from this amax."""
    codes: torch.Tensor | None
    scale: torch.Tensor | None
    amax: torch.Tensor


@triton.jit
def row_scale(row_max):
    return tl.maximum(tl.div_rn(row_max, FP8_MAX), MIN_SCALE)


@triton.jit
def row_codes(x, scale):
    """x (any float dtype) divided by its row's scale, saturated, as e4m3."""
    return tl.clamp(tl.div_rn(x.to(tl.float32), scale), -FP8_MAX, FP8_MAX).to(tl.float8e4nv)
