"""Round-to-nearest: each weight group gets a scale from its own values, no calibration.

Scales are computed with compressed-tensors' `calculate_qparams` (symmetric int4: amax / 7.5,
codes in [-8, 7]; fp8: amax / 448) and rounded to the dtype the checkpoint stores them in, so
the weights written are exactly what a loader reconstructs. For int weights the range is then
shrunk where that lowers the group's squared rounding error (clipping a rare large weight buys
finer steps for all the others), as llm-compressor's "mse" observer does; fp8 scales are
searched likewise, upwards from amax / 448.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from compressed_tensors.quantization import QuantizationArgs, QuantizationStrategy, QuantizationType
from compressed_tensors.quantization.lifecycle.forward import fake_quantize
from compressed_tensors.quantization.utils.helpers import calculate_qparams, calculate_range


@dataclass
class QuantizedWeight:
    weight: torch.Tensor      # the dequantized weight (what a loader reconstructs), float32
    scale: torch.Tensor       # [out, groups] or [out, 1], in the checkpoint's dtype
    zero_point: torch.Tensor  # zeros (symmetric), kept for compressed-tensors' module state


def weight_qparams(weight: torch.Tensor, args: QuantizationArgs, scale_dtype: torch.dtype,
                   clip_search: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point of `weight` [out, in] for a group or channel strategy."""
    w = weight.detach().float()     # a parameter's values: the search writes into buffers
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
    scale = scale.to(scale_dtype)
    if clip_search and args.type == QuantizationType.INT and not args.symmetric:
        scale, zero_point = _asymmetric_searched_qparams(w if w.dim() == 3 else w.unsqueeze(1),
                                                         lo, hi, args, scale_dtype)
    elif clip_search and args.type == QuantizationType.INT:
        scale = _clip_searched_scale(w if w.dim() == 3 else w.unsqueeze(1), lo, hi, args,
                                     scale_dtype)
    elif clip_search and args.strategy == QuantizationStrategy.CHANNEL:
        scale = _fp8_searched_scale(w, scale, args)
    return scale, zero_point


# range shrink factors tried: 1.0 (min/max) down to 0.7
_SHRINKS = [1.0 - 0.02 * i for i in range(16)]


def _clip_searched_scale(groups: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
                         args: QuantizationArgs, scale_dtype: torch.dtype) -> torch.Tensor:
    """groups [rows, n, size]; lo/hi [rows, n]: the scale of least squared error."""
    qmin, qmax = (float(v) for v in calculate_range(args, groups.device))

    def candidates():   # generated lazily: one candidate's tensors alive at a time
        for shrink in _SHRINKS:
            s = calculate_qparams(lo * shrink, hi * shrink, args)[0].to(scale_dtype)
            sf = s.float().unsqueeze(-1)
            rounded = torch.clamp(torch.round(groups / sf), qmin, qmax) * sf
            yield (s,), (rounded - groups).pow(2).sum(-1)
    return _least_error(candidates())[0]


# asymmetric range factors tried: a shrunk range clips rare extremes; a stretched one moves the
# grid against weights that already sit on another one (a 4-bit GGUF's), whose offset no
# integer zero point can match
_RANGES = [1.0 - 0.02 * i for i in range(16)] + [1.0 + 0.02 * i for i in range(1, 8)]


def _asymmetric_searched_qparams(groups: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
                                 args: QuantizationArgs, scale_dtype: torch.dtype
                                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """groups [rows, n, size]; lo/hi [rows, n]: the (scale, integer zero point) of least squared
    error, each range factor about the group's centre with the zero point rounded down and up."""
    qmin, qmax = (float(v) for v in calculate_range(args, groups.device))
    lo, hi = lo.clamp(max=0), hi.clamp(min=0)          # the grid holds 0 (compressed-tensors)
    centre, width = (lo + hi) / 2, (hi - lo).clamp(min=1e-12)

    # Two group-sized buffers for every candidate: fresh temporaries of the weight's size cost
    # more than the arithmetic (SmolLM2's search: 57 s -> 21 s, the same values). The integer
    # grid is exact in float32, so clamp(round(w / s) + z) - z == clamp(round(w / s), qmin - z,
    # qmax - z), and one rounding serves both zero points.
    rounded, diff = torch.empty_like(groups), torch.empty_like(groups)

    def candidates():
        for factor in _RANGES:
            s = (width * factor / (qmax - qmin)).to(scale_dtype)
            sf = s.float()
            z_real = qmin - (centre - width * factor / 2) / sf
            torch.div(groups, sf.unsqueeze(-1), out=rounded).round_()
            for z in (torch.floor(z_real), torch.ceil(z_real)):
                z = z.clamp(qmin, qmax)
                torch.clamp(rounded, (qmin - z).unsqueeze(-1), (qmax - z).unsqueeze(-1), out=diff)
                err = diff.mul_(sf.unsqueeze(-1)).sub_(groups).square_().sum(-1)
                yield (s, z), err
    scale, zero_point = _least_error(candidates())
    return scale, zero_point.to(args.zp_dtype)


def _least_error(candidates) -> tuple[torch.Tensor, ...]:
    """Elementwise, the values of the candidate of least error: each candidate is (a tuple of
    tensors, their error); ties keep the earlier one, so the first (the unsearched choice) is
    the bar."""
    best, best_err = None, None
    for values, err in candidates:
        if best is None:
            best, best_err = values, err
            continue
        better = err < best_err
        best = tuple(torch.where(better, v, b) for v, b in zip(values, best))
        best_err = torch.where(better, err, best_err)
    return best


# fp8 scale factors tried: amax / 448 times 1 to 2 (one octave: e4m3's grid repeats every doubling)
_FP8_STRETCHES = [1.0 + i / 32 for i in range(33)]


def _fp8_searched_scale(w: torch.Tensor, scale: torch.Tensor, args: QuantizationArgs) -> torch.Tensor:
    """Per row, the scale of least squared error among amax/448 stretched by up to 2x: float8's
    steps are relative, so the stretch only moves where its grid falls, and on weights that sit
    on a coarse grid already (a 4-bit GGUF's) a well-placed one rounds far less (SmolLM2:
    fp8 weights alone +1.6% perplexity at amax/448, -0.3% searched).

    Each candidate is compressed-tensors' fake_quantize (clamp(w / s) cast to float8 and back,
    times s; the zero point of a symmetric float is 0) written into two weight-sized buffers,
    the same values without its temporaries (tests/test_quantize_scales.py checks them)."""
    assert args.symmetric and args.num_bits == 8, "float8 e4m3 weights, symmetric"
    qmin, qmax = (float(v) for v in calculate_range(args, w.device))
    scaled, as_fp8 = torch.empty_like(w), torch.empty_like(w, dtype=args.pytorch_dtype())

    def candidates():
        for stretch in _FP8_STRETCHES:
            s = (scale.float() * stretch).to(scale.dtype)
            sf = s.float()
            torch.div(w, sf, out=scaled).clamp_(qmin, qmax)
            as_fp8.copy_(scaled)
            scaled.copy_(as_fp8)
            err = scaled.mul_(sf).sub_(w).square_().sum(1, keepdim=True)
            yield (s,), err
    return _least_error(candidates())[0]


def quantize_dequantize(weight: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                        args: QuantizationArgs) -> torch.Tensor:
    return fake_quantize(weight.float(), scale.float(), zero_point, args)


def rtn_quantize(weight: torch.Tensor, args: QuantizationArgs, scale_dtype: torch.dtype,
                 clip_search: bool = True) -> QuantizedWeight:
    scale, zero_point = weight_qparams(weight, args, scale_dtype, clip_search)
    return QuantizedWeight(quantize_dequantize(weight, scale, zero_point, args), scale, zero_point)
