"""Float32 CPU linears over GGUF blocks (kernels/cpu/gguf_block_gemm.c, models/layers/
cpu_gguf_linear.py): blocks made by gguf-py's own quantizer, the products of gguf-py's own
dequantized weights (a float64 matmul of them is the reference), bit-exact weights, and each row's
bits independent of the rows beside it, on both the few-row and the tiled path."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from autoglm_serve.kernels.cpu.gguf_block_gemm import Q4_1, Q8_0, available, gguf_block_gemm
from autoglm_serve.models.layers.cpu_gguf_linear import (GgufBlockLinearMethod, gguf_blocks,
                                                         use_gguf_block_linears)
from autoglm_serve.models.layers.cpu_onednn_linear import OneDnnLinearMethod, use_onednn_linears
from autoglm_serve.models.layers.embedding import ParallelLMHead
from autoglm_serve.models.layers.linear import MergedColumnParallelLinear, UnquantizedLinearMethod

pytestmark = pytest.mark.skipif(not available(), reason="no AVX2 or no C compiler")

GGML_TYPES = {Q4_1: GGMLQuantizationType.Q4_1, Q8_0: GGMLQuantizationType.Q8_0}
ROW_COUNTS = [1, 2, 3, 4, 5, 7, 8, 16, 17, 64]


def gguf_weight(block_format: int, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """A float32 [n, k] weight as the GGUF reader gives it: random values through gguf-py's
    quantizer and back through its dequantizer."""
    values = np.random.default_rng(seed).normal(0, 0.05, (n, k)).astype(np.float32)
    ggml_type = GGML_TYPES[block_format]
    return torch.from_numpy(dequantize(quantize(values, ggml_type), ggml_type).reshape(n, k).copy())


@pytest.mark.parametrize("block_format", [Q4_1, Q8_0])
def test_blocks_rebuild_every_weight_bit_for_bit(block_format):
    weight = gguf_weight(block_format, 40, 576)
    found, blocks = gguf_blocks(weight)
    assert found == block_format
    # x = the identity: row r of the product is column r of the weight, summed with zeros only
    assert torch.equal(gguf_block_gemm(torch.eye(576), blocks, found).T, weight)


@pytest.mark.parametrize("block_format", [Q4_1, Q8_0])
@pytest.mark.parametrize("n,k", [(960, 576), (96, 1536), (37, 64)])
def test_products_match_a_float64_matmul_at_every_row_count(block_format, n, k):
    weight = gguf_weight(block_format, n, k)
    _, blocks = gguf_blocks(weight)
    for rows in ROW_COUNTS:
        x = torch.randn(rows, k)
        out = gguf_block_gemm(x, blocks, block_format)
        assert out.dtype == torch.float32 and out.shape == (rows, n)
        torch.testing.assert_close(out.double(), x.double() @ weight.double().T,
                                   atol=1e-5, rtol=1e-5)
    assert gguf_block_gemm(torch.randn(0, k), blocks, block_format).shape == (0, n)
    with pytest.raises(TypeError, match="float32 CPU activations"):
        gguf_block_gemm(torch.randn(1, k, dtype=torch.bfloat16), blocks, block_format)
    with pytest.raises(ValueError, match="are not format"):     # another K's blocks
        gguf_block_gemm(torch.randn(1, k + 32), blocks, block_format)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("block_format", [Q4_1, Q8_0])
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it(block_format, threads):
    weight = gguf_weight(block_format, 100, 576)
    _, blocks = gguf_blocks(weight)
    x = torch.randn(80, 576)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        alone = torch.cat([gguf_block_gemm(x[i:i + 1], blocks, block_format)
                           for i in range(len(x))])
        for rows in ROW_COUNTS:
            for start in (0, 9):
                assert torch.equal(gguf_block_gemm(x[start:start + rows], blocks, block_format),
                                   alone[start:start + rows]), (rows, start)
    finally:
        torch.set_num_threads(before)


def test_weights_that_are_not_blocks_stay_dense():
    torch.manual_seed(0)
    assert gguf_blocks(torch.randn(64, 64)) is None            # random float32
    near = gguf_weight(Q4_1, 64, 64)
    near[3, 5] = torch.nextafter(near[3, 5], torch.tensor(1.0))  # one element off by one ulp
    assert gguf_blocks(near) is None
    assert gguf_blocks(gguf_weight(Q4_1, 64, 64)[:, :48].contiguous()) is None   # K % 32 != 0
    assert gguf_blocks(gguf_weight(Q4_1, 64, 64).bfloat16()) is None


def test_layer_takes_the_blocks_and_keeps_its_bias():
    layer = MergedColumnParallelLinear(64, [48, 48], bias=True, dtype=torch.float32)
    weight = gguf_weight(Q4_1, 96, 64)
    layer.weight.data.copy_(weight)
    layer.bias.data.normal_()
    bias = layer.bias.detach().clone()
    assert use_gguf_block_linears(layer) == {"Q4_1": 1, "Q8_0": 0}
    assert isinstance(layer.linear_method, GgufBlockLinearMethod)
    assert layer.weight.dtype == torch.uint8 and layer.weight.shape == (96, 2 * 24)
    x = torch.randn(2, 3, 64)
    torch.testing.assert_close(layer(x), F.linear(x, weight, bias), atol=1e-5, rtol=1e-5)
    # oneDNN then takes only what is left dense
    assert use_onednn_linears(layer) == 0


def test_random_layers_are_left_to_onednn():
    layer = MergedColumnParallelLinear(64, [48, 48], bias=False, dtype=torch.float32)
    layer.weight.data.normal_()
    assert use_gguf_block_linears(layer) == {"Q4_1": 0, "Q8_0": 0}
    assert type(layer.linear_method) is UnquantizedLinearMethod
    assert use_onednn_linears(layer) == 1 and isinstance(layer.linear_method, OneDnnLinearMethod)


def test_lm_head_reads_blocks_and_the_embedding_its_dense_weight():
    head = ParallelLMHead(1000, 64, torch.float32)
    head.weight.data.copy_(gguf_weight(Q8_0, 1000, 64))
    hidden = torch.randn(3, 64)
    reference = F.linear(hidden.double(), head.weight.double())
    assert use_gguf_block_linears(head) == {"Q4_1": 0, "Q8_0": 1}
    torch.testing.assert_close(head.compute_logits(hidden).double(), reference,
                               atol=1e-5, rtol=1e-5)
    assert torch.equal(head(torch.tensor([5])), head.weight[5:6])   # the embedding lookup
    assert use_onednn_linears(head) == 0   # the head's product is taken already


def test_float32_engine_reads_the_default_models_blocks(default_llm_float32):
    """SmolLM2's GGUF is Q4_1 but for its Q8_0 token embedding, which the LM head shares."""
    model = default_llm_float32.engine.core.runner.model
    linears = [m for m in model.modules() if hasattr(m, "linear_method")]
    assert linears and all(isinstance(m.linear_method, GgufBlockLinearMethod) and
                           m.linear_method.block_format == Q4_1 for m in linears)
    assert model.lm_head.cpu_logits.keywords["block_format"] == Q8_0
    assert ("120 Q4_1, 1 Q8_0 linears read as GGUF blocks"
            in default_llm_float32.engine.core.loaded.quantization)
