"""Decode linears on a CPU from 4-bit weights, for checkpoints whose weights are 4-bit already.

A GGUF Q4_1 file (the embedded default) is dequantized at load; streaming those weights back from
memory at 16 (bf16) or 32 (float32) bits is most of a CPU decode step (aten::mm was 69% of a
SmolLM2-135M step, ~20 ms, at ~27 GB/s). torch's `_weight_int4pack_mm_for_cpu` reads them at 4
bits: at one row, 2 threads, all of a step's linears took ~3.6 ms instead. With more rows it loses
to the dense bf16 matmul (AMX on this CPU: 99 against 48 us for 960x576 at 16 rows), so a layer
keeps both forms and picks by row count.

A layer is given the 4-bit form only where it holds the same weights: each group of 32 along the
input is re-quantized as w = d * q + m (q in 0..15, m the group minimum, d its range / 15, which
is how llama.cpp makes Q4_1 and so gives back its q exactly), and kept only where every element
is within an eighth of a step of the loaded weight (bf16 rounding of the scales costs ~1/32).
Random or 8-bit weights miss by up to half a step, and stay dense.
"""
from __future__ import annotations

import torch
from torch import nn

from autoglm_serve.models.layers.linear import LinearBase, UnquantizedLinearMethod

GROUP_SIZE = 32
# Rows up to this run the 4-bit kernel; more run the dense bf16 matmul. The 4-bit kernel's time
# grows with rows, the dense one's hardly does: SmolLM2's 120 linears with weights streamed from
# memory (not one hot weight), CPU ms at 8 rows 22.8 against 33.6 (1 thread), 24.4 against 39.2
# (2 threads); even at 12, behind at 16.
MAX_INT4_ROWS = 8
# Largest error, in steps (d), for which a group counts as already 4-bit.
_TOLERANCE_STEPS = 1 / 8


def cpu_int4_available() -> bool:
    """torch's CPU int4 kernel is only fast with native bf16 (AVX512-BF16 or AMX); elsewhere the
    bf16 activations it needs cost more than the 4-bit weights save."""
    return (hasattr(torch, "_weight_int4pack_mm_for_cpu")
            and torch.cpu._is_avx512_bf16_supported())


def quantize_if_4bit(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(packed int4 weight, [K/32, N, 2] bf16 scales and zeros) for torch's CPU int4 kernel, or
    None where ``weight`` [N, K] is not 4-bit groups of 32 already."""
    n, k = weight.shape
    if k % GROUP_SIZE:
        return None
    groups = weight.detach().float().reshape(n, k // GROUP_SIZE, GROUP_SIZE)
    low = groups.amin(dim=-1, keepdim=True)
    step = (groups.amax(dim=-1, keepdim=True) - low) / 15
    safe_step = torch.where(step > 0, step, torch.ones_like(step))
    q = torch.round((groups - low) / safe_step).clamp_(0, 15)
    # torch's convention: w = (q - 8) * scale + zero
    scale = step.to(torch.bfloat16)
    zero = (low + 8 * step).to(torch.bfloat16)
    restored = (q - 8) * scale.float() + zero.float()
    if ((restored - groups).abs() > _TOLERANCE_STEPS * step + 1e-12).any():
        return None
    packed = torch._convert_weight_to_int4pack_for_cpu(q.reshape(n, k).to(torch.int32), 1)
    scales_zeros = torch.cat([scale, zero], dim=-1).transpose(0, 1).contiguous()  # [K/32, N, 2]
    return packed, scales_zeros


def int4_linear(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w^T (+ bias) with w in torch's CPU int4 form; x bf16."""
    rows = x.reshape(-1, x.shape[-1])
    out = torch._weight_int4pack_mm_for_cpu(rows.contiguous(), packed, GROUP_SIZE, scales_zeros)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


class CpuInt4LinearMethod(UnquantizedLinearMethod):
    """The dense bf16 weight plus its 4-bit form; the 4-bit kernel for a few rows."""

    def apply(self, layer, x, bias, fp8_rows=None):
        if x.numel() <= MAX_INT4_ROWS * x.shape[-1] and x.dtype == torch.bfloat16:
            return int4_linear(x, layer.int4_weight, layer.int4_scales_zeros, bias)
        return super().apply(layer, x, bias)


def use_int4_where_4bit(model: nn.Module) -> int:
    """Gives every unquantized bf16 CPU linear whose weights are 4-bit groups the 4-bit kernel
    for decode; returns how many layers took it."""
    converted = 0
    for module in model.modules():
        if not (isinstance(module, LinearBase)
                and type(module.linear_method) is UnquantizedLinearMethod
                and module.weight.dtype == torch.bfloat16 and module.weight.device.type == "cpu"):
            continue
        quantized = quantize_if_4bit(module.weight)
        if quantized is None:
            continue
        module.register_buffer("int4_weight", quantized[0], persistent=False)
        module.register_buffer("int4_scales_zeros", quantized[1], persistent=False)
        module.linear_method = CpuInt4LinearMethod()
        converted += 1
    return converted
