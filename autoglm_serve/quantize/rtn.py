"""Round-to-nearest: each weight group gets the scale of its own min/max, no calibration.

Scales are computed with compressed-tensors' `calculate_qparams` (symmetric int4: amax / 7.5,
codes in [-8, 7]; fp8: amax / 448) and rounded to the dtype the checkpoint stores them in, so
the weights written are exactly what a loader reconstructs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from compressed_tensors.quantization import QuantizationArgs, QuantizationStrategy
from compressed_tensors.quantization.lifecycle.forward import fake_quantize
from compressed_tensors.quantization.utils.helpers import calculate_qparams


@dataclass
class QuantizedWeight:
    weight: torch.Tensor      # the dequantized weight (what a loader reconstructs), float32
    scale: torch.Tensor       # [out, groups] or [out, 1], in the checkpoint's dtype
    zero_point: torch.Tensor  # zeros (symmetric), kept for compressed-tensors' module state


def weight_qparams(weight: torch.Tensor, args: QuantizationArgs,
                   scale_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point of `weight` [out, in] for a group or channel strategy."""
    w = weight.float()
    if args.strategy == QuantizationStrategy.GROUP:
        if w.shape[1] % args.group_size:
            raise ValueError(f"input width {w.shape[1]} is not a multiple of group size {args.group_size}")
        w = w.reshape(w.shape[0], -1, args.group_size)
        lo, hi = w.amin(dim=-1), w.amax(dim=-1)
    elif args.strategy == QuantizationStrategy.CHANNEL:
        lo, hi = w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    else:
        raise ValueError(f"unsupported weight strategy {args.strategy}")
    scale, zero_point = calculate_qparams(lo, hi, args)
    return scale.to(scale_dtype), zero_point


def quantize_dequantize(weight: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                        args: QuantizationArgs) -> torch.Tensor:
    return fake_quantize(weight.float(), scale.float(), zero_point, args)


def rtn_quantize(weight: torch.Tensor, args: QuantizationArgs,
                 scale_dtype: torch.dtype) -> QuantizedWeight:
    scale, zero_point = weight_qparams(weight, args, scale_dtype)
    return QuantizedWeight(quantize_dequantize(weight, scale, zero_point, args), scale, zero_point)
