"""FP8 W8A8 linear method: e4m3 weights with one float32 scale per output channel, activations
quantized per token at run time (dynamic: scale = row amax / 448), multiplied by
``torch._scaled_mm`` with row-wise scales (on CUDA; PyTorch's CPU build runs the same op from
2.13, so CI exercises the same numerics; an older CPU build, which takes single scales only,
multiplies the e4m3 values in float32 and applies the same scales after).

From a compressed-tensors float-quantized checkpoint the e4m3 weight and its scale load as they
are; with ``quantize_at_load`` (``--quantization fp8`` on a 16-bit checkpoint) the layer loads
the 16-bit weight and quantizes it once all of it is there. Each step is a fixed sequence of
kernels on fixed shapes (amax, divide, cast, scaled GEMM; on CUDA one Triton kernel for the
quantization, kernels/fp8_quant.py, or none where the fused norm before the layer wrote the rows
quantized, kernels/fp8_rows.py; for a few rows the FP8 decode GEMV, kernels/fp8_gemv.py; for a
decode batch's rows, where it measured faster, the split-K GEMM of kernels/fp8_gemm.py): no
host syncs, CUDA-graph safe.
"""
from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

import torch
from torch import nn

from autoglm_serve.kernels import fused_kernels_on
from autoglm_serve.models.layers.activation import silu_and_mul
from autoglm_serve.models.layers.linear import LinearMethod

if TYPE_CHECKING:     # kernels/ imports Triton, which a CPU install may lack
    from autoglm_serve.kernels.fp8_rows import Fp8Rows

logger = logging.getLogger(__name__)

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
_MIN_SCALE = 1e-12
# Above this many rows (a prompt's) ``_scaled_mm`` accumulates in the tensor cores' own fp32
# sums throughout ("fast accumulation", as torchao's FP8 inference does), not promoted to CUDA
# cores every few K chunks: on an H100 at 2,048 rows the four GEMMs of a layer 762 -> 662 us
# (bf16 1,231), relative error 1.7e-3 -> 2.1e-3 (down, K 13,696: 3.3e-3; the bf16 output's own
# rounding is 1.7e-3). Decode batches keep exact sums, as the FP8 GEMV and split-K GEMM do:
# memory-bound there, fast accumulation saves nothing.
FAST_ACCUM_ABOVE_ROWS = 256


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, C] -> (e4m3 [R, C], float32 scale [R, 1]) with x ~= q * scale, per row."""
    amax = x.abs().amax(dim=-1, keepdim=True).to(torch.float32)
    # divided by a tensor on amax's device: CUDA divides by a Python number through its
    # reciprocal (an ulp off at times), a CPU does not; the Triton kernels divide exactly too
    scale = (amax / torch.full_like(amax, FP8_MAX)).clamp_min(_MIN_SCALE)
    q = (x.to(torch.float32) / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
               bias: torch.Tensor | None, fp8_rows: Fp8Rows | None = None) -> torch.Tensor:
    """x [..., K] (16/32-bit), weight e4m3 [N, K], weight_scale float32 [N] -> [..., N].
    fp8_rows: x quantized per token by the kernel that wrote it (GLM's fused norm pair before
    qkv and gate_up), else None (quantized here)."""
    shape = x.shape
    gemv = _decode_gemv(x, weight, bias, gated=False)
    if gemv is not None:      # a few rows: the FP8 decode GEMV, quantizing x inside
        return gemv.fp8_gemv(x, weight, weight_scale, bias,
                             row_amax=None if fp8_rows is None else fp8_rows.amax)
    x2 = x.reshape(-1, shape[-1])
    if fp8_rows is not None and fp8_rows.codes is not None:
        xq, x_scale = fp8_rows.codes, fp8_rows.scale
    else:
        quant = _quant_kernels(x)
        xq, x_scale = quant.quantize_rows(x2) if quant is not None else quantize_rows(x2)
    out = scaled_gemm(xq, x_scale, weight, weight_scale, bias, x.dtype)
    return out.reshape(*shape[:-1], weight.shape[0])


def fp8_linear_of_silu_and_mul(gate_up: torch.Tensor, weight: torch.Tensor,
                               weight_scale: torch.Tensor,
                               bias: torch.Tensor | None) -> torch.Tensor:
    """fp8_linear(silu(gate) * up) for [..., 2K] rows of [gate | up]: on the ``_scaled_mm`` path
    one kernel computes the product and quantizes it (kernels/fp8_quant.py)."""
    k = weight.shape[1]
    quant = _quant_kernels(gate_up)
    if quant is None or _decode_gemv(gate_up[..., :k], weight, bias, gated=False) is not None:
        return fp8_linear(silu_and_mul(gate_up), weight, weight_scale, bias)
    shape = gate_up.shape
    xq, x_scale = quant.silu_and_mul_quantize(gate_up.reshape(-1, shape[-1]))
    out = scaled_gemm(xq, x_scale, weight, weight_scale, bias, gate_up.dtype)
    return out.reshape(*shape[:-1], weight.shape[0])


def scaled_gemm(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
                weight_scale: torch.Tensor, bias: torch.Tensor | None,
                out_dtype: torch.dtype) -> torch.Tensor:
    """(xq * x_scale) @ (weight * weight_scale)^T + bias: e4m3 [M, K] rows with float32 [M, 1]
    scales against the e4m3 [N, K] weight, in ``out_dtype``."""
    gemm = _split_k_gemm(xq, weight, out_dtype)
    if gemm is not None:      # a decode batch's rows: the split-K GEMM, where measured faster
        return gemm.fp8_gemm(xq, x_scale, weight, weight_scale, bias, out_dtype)
    epilogue_bias = None
    if xq.device.type == "cpu" and not cpu_scaled_mm_takes_row_scales():
        out = ((xq.float() @ weight.float().t()) * x_scale * weight_scale).to(out_dtype)
    else:
        # the bias in the GEMM's epilogue: no kernel of its own (qkv's, every layer)
        if bias is not None and epilogue_bias_works(xq.device, out_dtype):
            epilogue_bias = bias
        out = torch._scaled_mm(xq, weight.t(), scale_a=x_scale,
                               scale_b=weight_scale.view(1, -1), bias=epilogue_bias,
                               out_dtype=out_dtype,
                               use_fast_accum=xq.shape[0] > FAST_ACCUM_ABOVE_ROWS)
    if bias is not None and epilogue_bias is None:
        out = out + bias
    return out


def _quant_kernels(x: torch.Tensor):
    """kernels/fp8_quant.py where its kernels run on x (CUDA, fused kernels on, its start-up
    check passed), else None (the torch ops)."""
    if not fused_kernels_on(x):
        return None
    from autoglm_serve.kernels import fp8_quant
    return fp8_quant if fp8_quant.ENABLED else None


@functools.cache
def cpu_scaled_mm_takes_row_scales() -> bool:
    """Whether torch's CPU `_scaled_mm` takes a scale per row of A and per column of B (torch
    2.13 does; 2.11 asserts that both scales are single numbers). Where not, the CPU multiplies
    the e4m3 values in float32 and applies the same scales after."""
    a = torch.zeros(1, 16, dtype=FP8)
    b = torch.zeros(16, 16, dtype=FP8).t()
    try:
        torch._scaled_mm(a, b, scale_a=torch.ones(1, 1), scale_b=torch.ones(1, 16),
                         out_dtype=torch.float32)
    except RuntimeError:
        return False
    return True


@functools.cache
def epilogue_bias_works(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether torch's row-wise ``_scaled_mm`` here adds a bias of ``dtype`` in its epilogue
    as the W8A8 reference does. cuBLAS takes a 16-bit bias with a 16-bit output only (torch
    refuses a float32 one on CUDA); elsewhere the bias is added after the GEMM. Each FP8 layer
    asks at load, so the answer is known before any forward (and any CUDA-graph capture)."""
    if dtype not in (torch.bfloat16, torch.float16):
        return False
    gen = torch.Generator().manual_seed(0)
    xq, xs = quantize_rows(torch.randn(32, 64, generator=gen).to(device, dtype))
    wq, ws = quantize_rows((torch.randn(48, 64, generator=gen) * 0.1).to(device))
    bias = torch.randn(48, generator=gen).to(device, dtype)
    try:
        out = torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws.view(1, -1), bias=bias,
                               out_dtype=dtype)
    except RuntimeError as exc:
        logger.info("FP8 GEMMs add their bias after _scaled_mm here: %r", exc)
        return False
    want = (xq.float() * xs) @ (wq.float() * ws).t() + bias.float()
    err = ((out.float() - want).norm() / want.norm()).item()
    if not err < 2e-2:
        logger.warning("_scaled_mm's bias disagrees with the reference (relative error %.3g): "
                       "FP8 GEMMs add their bias after it", err)
    return err < 2e-2


def _split_k_gemm(xq, weight, out_dtype):
    """kernels/fp8_gemm.py where it takes this product (CUDA, fused kernels on, a tuned shape,
    its start-up check passed), else None (``_scaled_mm``)."""
    if not fused_kernels_on(xq):
        return None
    from autoglm_serve.kernels import fp8_gemm
    return fp8_gemm if fp8_gemm.supports(xq, weight, out_dtype) else None


def _decode_gemv(x, weight, bias, gated):
    """kernels/fp8_gemv.py where it takes this call (CUDA, fused kernels on, a few rows)."""
    if not fused_kernels_on(x):
        return None
    from autoglm_serve.kernels import fp8_gemv
    return fp8_gemv if fp8_gemv.supports(x, weight, bias, gated) else None


class Fp8LinearMethod(LinearMethod):
    takes_fp8_rows = True

    def __init__(self, quantize_at_load: bool, params_dtype: torch.dtype):
        self.quantize_at_load = quantize_at_load
        self.params_dtype = params_dtype

    def create_weights(self, layer, in_features, out_features, dtype):
        if in_features % 16 or out_features % 16:
            raise ValueError(f"FP8 GEMMs need sizes that are multiples of 16, not "
                             f"{out_features} x {in_features}")
        wdtype = self.params_dtype if self.quantize_at_load else FP8
        layer.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=wdtype),
                                    requires_grad=False)
        if not self.quantize_at_load:
            # 1-D so the row-parallel loader keeps it whole (a per-output-channel quantity)
            layer.weight_scale = nn.Parameter(torch.empty(out_features, dtype=torch.float32),
                                              requires_grad=False)

    def process_weights_after_loading(self, layer) -> None:
        if layer.bias is not None:
            epilogue_bias_works(layer.weight.device, self.params_dtype)
        if self.quantize_at_load:
            q, scale = quantize_rows(layer.weight.data)
            layer.weight = nn.Parameter(q, requires_grad=False)
            layer.weight_scale = nn.Parameter(scale.view(-1), requires_grad=False)
        elif not bool(torch.isfinite(layer.weight_scale.data).all()):
            raise ValueError("FP8 weight scales are not finite")

    def apply(self, layer, x, bias, fp8_rows=None):
        return fp8_linear(x, layer.weight, layer.weight_scale, bias, fp8_rows)

    def apply_to_silu_and_mul(self, layer, gate_up, bias):
        return fp8_linear_of_silu_and_mul(gate_up, layer.weight, layer.weight_scale, bias)

    def apply_gated_silu(self, layer, x, fp8_rows=None):
        if layer.bias is not None:
            return None
        gemv = _decode_gemv(x, layer.weight, None, gated=True)
        if gemv is None:
            return None
        return gemv.fp8_gated_gemv(x, layer.weight, layer.weight_scale,
                                   row_amax=None if fp8_rows is None else fp8_rows.amax)
