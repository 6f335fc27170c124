"""Float32 CPU linears through oneDNN (models/layers/cpu_onednn_linear.py): the same products as
a float64 matmul within float32 rounding, and each row's bits independent of the rows beside it
(which F.linear on MKL does not give: one row runs a GEMV, more a GEMM)."""
import pytest
import torch
import torch.nn.functional as F

from autoglm_serve.models.layers.cpu_onednn_linear import (OneDnnLinearMethod,
                                                           onednn_linear_available,
                                                           use_onednn_linears)
from autoglm_serve.models.layers.embedding import ParallelLMHead
from autoglm_serve.models.layers.linear import QKVParallelLinear, UnquantizedLinearMethod

pytestmark = pytest.mark.skipif(not onednn_linear_available(), reason="torch without oneDNN")

ROW_COUNTS = [1, 2, 3, 5, 8, 16, 17, 64, 200]


def _qkv_layer(dtype=torch.float32) -> QKVParallelLinear:
    torch.manual_seed(0)
    layer = QKVParallelLinear(96, 32, num_heads=4, num_kv_heads=2, bias=True, dtype=dtype)
    layer.weight.data.normal_(0, 0.1)
    layer.bias.data.normal_(0, 0.1)
    return layer


def test_layer_matches_a_float64_matmul_at_every_row_count():
    layer = _qkv_layer()
    weight, bias = layer.weight.detach().clone(), layer.bias.detach().clone()
    assert use_onednn_linears(layer) == 1
    assert isinstance(layer.linear_method, OneDnnLinearMethod) and layer.weight.is_mkldnn
    for rows in ROW_COUNTS:
        x = torch.randn(rows, 96)
        out = layer(x)
        ref = F.linear(x.double(), weight.double(), bias.double())
        assert out.dtype == torch.float32 and out.shape == (rows, 256)
        torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    # leading dimensions kept, as F.linear keeps them
    assert layer(torch.randn(2, 3, 96)).shape == (2, 3, 256)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it(threads):
    layer = _qkv_layer()
    use_onednn_linears(layer)
    x = torch.randn(256, 96)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        alone = torch.cat([layer(x[i:i + 1]) for i in range(len(x))])
        for rows in ROW_COUNTS:
            for start in (0, 7):
                assert torch.equal(layer(x[start:start + rows]), alone[start:start + rows]), \
                    (rows, start)
    finally:
        torch.set_num_threads(before)


def test_only_unquantized_float32_cpu_linears_move():
    bf16 = _qkv_layer(torch.bfloat16)
    assert use_onednn_linears(bf16) == 0
    assert type(bf16.linear_method) is UnquantizedLinearMethod and not bf16.weight.is_mkldnn


def test_lm_head_keeps_the_dense_weight_a_tied_embedding_reads():
    torch.manual_seed(0)
    head = ParallelLMHead(1000, 64, torch.float32)
    head.weight.data.normal_()
    hidden = torch.randn(3, 64)
    before = head.compute_logits(hidden)
    assert use_onednn_linears(head) == 1
    assert not head.weight.is_mkldnn and head.cpu_logits.keywords["reordered"].is_mkldnn
    torch.testing.assert_close(head.compute_logits(hidden), before, atol=1e-5, rtol=1e-5)
    assert torch.equal(head(torch.tensor([5])), head.weight[5:6])   # the embedding lookup
