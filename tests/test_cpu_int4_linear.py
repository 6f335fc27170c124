"""The CPU int4 decode linear (models/layers/cpu_int4_linear.py) against dequantize-then-matmul."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from autoglm_serve.models.layers.cpu_int4_linear import (MAX_INT4_ROWS, CpuInt4LinearMethod,
                                                         cpu_int4_available, quantize_if_4bit,
                                                         use_int4_where_4bit)
from autoglm_serve.models.layers.linear import RowParallelLinear, UnquantizedLinearMethod

pytestmark = pytest.mark.skipif(not cpu_int4_available(), reason="CPU without native bf16")


def _gguf_round_trip(shape, qtype) -> torch.Tensor:
    """A weight as the GGUF loader hands it over: quantized by gguf, dequantized, in bf16."""
    w = np.random.default_rng(0).standard_normal(shape).astype(np.float32) * 0.05
    return torch.from_numpy(dequantize(quantize(w, qtype), qtype).reshape(shape)).to(torch.bfloat16)


def _layer(weight: torch.Tensor) -> RowParallelLinear:
    layer = RowParallelLinear(weight.shape[1], weight.shape[0], bias=True, dtype=torch.bfloat16)
    layer.weight.data.copy_(weight)
    layer.bias.data.copy_(torch.linspace(-1, 1, weight.shape[0]))
    return layer


@pytest.mark.parametrize("rows", [1, MAX_INT4_ROWS, MAX_INT4_ROWS + 1, 16])
def test_q4_1_layer_matches_dequantized_matmul(rows):
    torch.manual_seed(0)
    weight = _gguf_round_trip((96, 128), GGMLQuantizationType.Q4_1)
    layer = _layer(weight)
    assert use_int4_where_4bit(layer) == 1
    assert isinstance(layer.linear_method, CpuInt4LinearMethod)
    x = torch.randn(rows, 128).to(torch.bfloat16)
    out = layer(x)
    ref = F.linear(x.float(), weight.float(), layer.bias.float())
    assert out.dtype == torch.bfloat16 and out.shape == (rows, 96)
    # bf16 output and bf16 scales: a few bf16 ulps of the output's scale
    torch.testing.assert_close(out.float(), ref, atol=0.02 * ref.abs().max().item(), rtol=0)
    if rows <= MAX_INT4_ROWS:  # the 4-bit kernel ran, and gives the same as the dense bf16 path
        dense = UnquantizedLinearMethod().apply(layer, x, layer.bias)
        torch.testing.assert_close(out, dense, atol=0.02 * ref.abs().max().item(), rtol=0)


def test_restored_weights_are_the_checkpoints():
    weight = _gguf_round_trip((64, 256), GGMLQuantizationType.Q4_1)
    packed, scales_zeros = quantize_if_4bit(weight)
    # the kernel applied to the identity gives back the weights it holds
    eye = torch.eye(256, dtype=torch.bfloat16)
    restored = torch._weight_int4pack_mm_for_cpu(eye, packed, 32, scales_zeros).T
    groups = weight.float().reshape(64, 8, 32)
    step = (groups.amax(-1) - groups.amin(-1)) / 15
    err = (restored.float() - weight.float()).abs().reshape(64, 8, 32).amax(-1)
    assert (err <= step / 8 + 1e-6).all()


@pytest.mark.parametrize("kind", ["gaussian", "q8_0"])
def test_weights_that_are_not_4bit_stay_dense(kind):
    weight = (torch.randn(64, 128).to(torch.bfloat16) if kind == "gaussian"
              else _gguf_round_trip((64, 128), GGMLQuantizationType.Q8_0))
    assert quantize_if_4bit(weight) is None
    layer = _layer(weight)
    assert use_int4_where_4bit(layer) == 0
    assert type(layer.linear_method) is UnquantizedLinearMethod


def test_float32_layers_are_left_alone():
    weight = _gguf_round_trip((64, 128), GGMLQuantizationType.Q4_1)
    layer = RowParallelLinear(128, 64, dtype=torch.float32)
    layer.weight.data.copy_(weight.float())
    assert use_int4_where_4bit(layer) == 0
