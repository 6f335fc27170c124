"""W4A16 / W8A16 linear method: packed int weights, a 16-bit scale (and optional zero point) per
group of input channels, 16-bit activations. Every format (compressed-tensors, AWQ, GPTQ) is
converted to this one layout as its tensors load (checkpoint_tensors.py), output features first,
so the layers' loaders shard it like a dense weight: by rows, or by packed columns and groups.

Parameters: ``qweight`` int32 [N, K * bits / 32]; ``scales`` [N, K / group]; ``zeros`` uint8
[N, K / group] (asymmetric only); ``g_idx`` int32 [K] (act-order only: input channel -> group).
After loading, act-order weights are permuted so groups are contiguous again and ``perm``
reorders the input instead (one gather of x per call rather than a group lookup per weight).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autoglm_serve.kernels import fused_kernels_on
from autoglm_serve.models.layers.linear import LinearMethod
from autoglm_serve.quantization.config import WeightScheme
from autoglm_serve.quantization.packing import pack_factor, pack_last_dim, unpack_last_dim


# Above this many rows a call dequantizes its weight for cuBLAS; at or below it the Triton
# kernels read the packed weight (the decode GEMVs, else kernels/wna16.py).
DEQUANTIZE_ABOVE_ROWS = 16


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


def dequantize(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
               bits: int, dtype: torch.dtype) -> torch.Tensor:
    """The reference: [N, K] weight in ``dtype`` from our packed layout."""
    q = unpack_last_dim(qweight, bits).to(torch.float32)
    group = q.shape[1] // scales.shape[1]
    zero = (zeros.to(torch.float32) if zeros is not None
            else torch.full_like(scales, 1 << (bits - 1), dtype=torch.float32))
    w = (q - zero.repeat_interleave(group, 1)) * scales.to(torch.float32).repeat_interleave(group, 1)
    return w.to(dtype)


class WNA16LinearMethod(LinearMethod):
    def __init__(self, scheme: WeightScheme, params_dtype: torch.dtype):
        self.scheme = scheme
        self.params_dtype = params_dtype

    def group_of(self, in_features: int) -> int:
        return self.scheme.group_size or in_features

    def create_weights(self, layer, in_features, out_features, dtype):
        s, pf = self.scheme, pack_factor(self.scheme.bits)
        group = self.group_of(in_features)
        if in_features % group or group % pf:
            raise ValueError(f"{in_features} input features do not split into groups of {group} "
                             f"({s.bits}-bit values pack {pf} to an int32)")
        layer.qweight = _param(torch.empty(out_features, in_features // pf, dtype=torch.int32))
        layer.scales = _param(torch.empty(out_features, in_features // group,
                                          dtype=self.params_dtype))
        if s.has_zeros:
            layer.zeros = _param(torch.empty(out_features, in_features // group,
                                             dtype=torch.uint8))
        if s.act_order:
            layer.g_idx = _param(torch.empty(in_features, dtype=torch.int32))
            layer.g_idx.weight_loader = _load_g_idx
        layer.group_size = group
        layer.register_buffer("perm", None, persistent=False)

    def process_weights_after_loading(self, layer) -> None:
        bits = self.scheme.bits
        if self.scheme.has_zeros:   # random (dummy) bytes to in-range zero points
            layer.zeros.data &= (1 << bits) - 1
        if not self.scheme.act_order:
            return
        g_idx = layer.g_idx.data.long()
        del layer.g_idx
        group = layer.group_size
        if torch.equal(g_idx, torch.arange(g_idx.numel(), device=g_idx.device) // group):
            return        # act-order asked for, but the order is the identity
        counts = torch.bincount(g_idx, minlength=layer.scales.shape[1])
        if counts.numel() != layer.scales.shape[1] or not bool((counts == group).all()):
            raise ValueError("g_idx does not assign exactly group_size input channels to each "
                             "group; this act-order layout is not supported")
        perm = torch.argsort(g_idx, stable=True)
        q = unpack_last_dim(layer.qweight.data, bits)[:, perm]
        layer.qweight.data = pack_last_dim(q, bits)
        layer.perm = perm.to(torch.int32 if layer.qweight.is_cuda else torch.long)

    def apply(self, layer, x, bias, fp8_rows=None):
        if layer.perm is not None:
            x = x.index_select(-1, layer.perm)
        zeros = getattr(layer, "zeros", None)
        if x.is_cuda:
            return cuda_linear(x, layer.qweight, layer.scales, zeros, self.scheme.bits,
                               layer.group_size, bias)
        # CPU: dequantize, then the dense matmul (tests and CI run quantized models this way)
        w = dequantize(layer.qweight, layer.scales, zeros, self.scheme.bits, x.dtype)
        return F.linear(x, w, bias)

    def apply_gated_silu(self, layer, x, fp8_rows=None):
        if layer.bias is not None or not x.is_cuda:
            return None
        if layer.perm is not None:
            x = x.index_select(-1, layer.perm)
        gemv = _decode_gemv(x, layer.qweight, layer.scales, self.scheme.bits, layer.group_size,
                            None, gated=True)
        if gemv is None:
            return None
        return gemv(x, layer.qweight, layer.scales, getattr(layer, "zeros", None),
                    layer.group_size)


def cuda_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                zeros: torch.Tensor | None, bits: int, group: int,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ dequant(W)^T (+ bias) on the GPU, x already in the weight's input order: the decode
    GEMV for a few rows, cuBLAS on the weight dequantized once for many, else the Triton
    kernel. (scripts/gpu/int8_linears_bench.py times this same choice.)"""
    gemv = _decode_gemv(x, qweight, scales, bits, group, bias, gated=False)
    if gemv is not None:
        return gemv(x, qweight, scales, zeros, group, bias)
    if x.numel() > DEQUANTIZE_ABOVE_ROWS * x.shape[-1]:
        # compute-bound: cuBLAS on the weight dequantized once (kernels/wna16_dequant.py)
        from autoglm_serve.kernels import wna16_dequant
        w = wna16_dequant.dequantize(qweight, scales, zeros, bits, group, x.dtype)
        return F.linear(x, w, bias)
    from autoglm_serve.kernels.wna16 import wna16_linear
    return wna16_linear(x, qweight, scales, zeros, bits, group, bias)


def decode_gemv_kernel(bits: int):
    """(module, GEMV, gated GEMV) of the ``bits``-bit decode GEMV: kernels/w4a16_gemv.py at 4
    bits, w8a16_gemv.py at 8; None at other widths. The one map from a width to its kernel (the
    layers' dispatch and the start-up check, quantization/kernel_checks.py, both read it)."""
    from autoglm_serve.kernels import w4a16_gemv, w8a16_gemv
    if bits == 4:
        return w4a16_gemv, w4a16_gemv.w4a16_gemv, w4a16_gemv.w4a16_gated_gemv
    if bits == 8:
        return w8a16_gemv, w8a16_gemv.w8a16_gemv, w8a16_gemv.w8a16_gated_gemv
    return None


def _decode_gemv(x, qweight, scales, bits, group, bias, gated):
    """The decode GEMV for this call where one takes it (CUDA, fused kernels on, a few rows);
    else None."""
    if not fused_kernels_on(x):
        return None
    kernel = decode_gemv_kernel(bits)
    if kernel is None:
        return None
    module, linear, gated_linear = kernel
    if not module.supports(x, qweight, scales, bits, group, bias, gated):
        return None
    return gated_linear if gated else linear


def _load_g_idx(param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
    """q/k/v (and gate/up) share their input, so act-order gives them one g_idx: keep it
    once, and refuse a checkpoint whose fused parts disagree."""
    if loaded.shape != param.shape:
        raise ValueError(f"g_idx of shape {tuple(loaded.shape)} for {param.shape[0]} inputs")
    first = not getattr(param, "g_idx_loaded", False)
    if not first and not torch.equal(param.data.cpu(), loaded.to(torch.int32)):
        raise ValueError("fused projections (q/k/v or gate/up) have different act-order g_idx")
    param.data.copy_(loaded)
    param.g_idx_loaded = True
