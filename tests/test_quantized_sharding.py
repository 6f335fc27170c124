"""Quantized weights shard like dense ones, through the layers' own weight_loader(param, loaded,
shard_id): output-parallel layers keep their rows (q/k/v and gate/up by part), input-parallel
layers their columns of packed words and their groups of scales and zero points, so the ranks'
partial products add up to the unsharded layer's output."""
import pytest
import torch

from autoglm_serve.models.layers import parallel_state
from autoglm_serve.models.layers.linear import (MergedColumnParallelLinear, QKVParallelLinear,
                                                 RowParallelLinear)
from autoglm_serve.quantization.config import WeightScheme
from autoglm_serve.quantization.packing import pack_last_dim
from autoglm_serve.quantization.wna16 import WNA16LinearMethod

SCHEME = WeightScheme("wna16", 4, 32, has_zeros=True)


@pytest.fixture
def world():
    def set_rank(rank, size):
        parallel_state._STATE.rank, parallel_state._STATE.world_size = rank, size
    yield set_rank
    set_rank(0, 1)


def quantized(n, k, seed):
    g = torch.Generator().manual_seed(seed)
    return {"qweight": pack_last_dim(torch.randint(0, 16, (n, k), generator=g), 4),
            "scales": torch.rand(n, k // 32, generator=g) * 0.01,
            "zeros": torch.randint(0, 16, (n, k // 32), generator=g, dtype=torch.uint8)}


def load(layer, tensors, shard_id=None):
    for name, t in tensors.items():
        param = getattr(layer, name)
        param.weight_loader(param, t, shard_id)
    layer.linear_method.process_weights_after_loading(layer)


def test_row_parallel_ranks_sum_to_the_whole(world):
    full = quantized(48, 256, 0)
    x = torch.randn(3, 256)
    world(0, 1)
    whole = RowParallelLinear(256, 48, linear_method=WNA16LinearMethod(SCHEME, torch.float32))
    load(whole, full)
    ref = whole.linear_method.apply(whole, x, None)
    parts = []
    for rank in range(2):
        world(rank, 2)
        layer = RowParallelLinear(256, 48, linear_method=WNA16LinearMethod(SCHEME, torch.float32))
        load(layer, full)
        assert layer.scales.shape == (48, 4) and layer.qweight.shape == (48, 16)
        parts.append(layer.linear_method.apply(layer, x[:, rank * 128:(rank + 1) * 128], None))
    assert torch.allclose(parts[0] + parts[1], ref, atol=1e-5)


def test_qkv_and_gate_up_ranks_keep_their_rows(world):
    x = torch.randn(2, 64)
    q, k, v = quantized(64, 64, 1), quantized(32, 64, 2), quantized(32, 64, 3)
    gate, up = quantized(96, 64, 4), quantized(96, 64, 5)
    method = lambda: WNA16LinearMethod(SCHEME, torch.float32)  # noqa: E731

    def loaded_layers():
        """qkv and gate_up layers of this rank, their shards loaded from the checkpoint's parts."""
        qkv = QKVParallelLinear(64, 16, 4, 2, linear_method=method())
        mlp = MergedColumnParallelLinear(64, [96, 96], linear_method=method())
        for part, sid in ((q, "q"), (k, "k"), (v, "v")):
            load(qkv, part, sid)
        for part, sid in ((gate, 0), (up, 1)):
            load(mlp, part, sid)
        return qkv, mlp

    world(0, 1)
    ref_qkv, ref_mlp = (layer.linear_method.apply(layer, x, None) for layer in loaded_layers())
    for rank in range(2):
        world(rank, 2)
        qkv, mlp = loaded_layers()
        out = qkv.linear_method.apply(qkv, x, None)      # [q 32 | k 16 | v 16] of this rank
        qs, ks = slice(rank * 32, rank * 32 + 32), slice(64 + rank * 16, 64 + rank * 16 + 16)
        vs = slice(96 + rank * 16, 96 + rank * 16 + 16)
        assert torch.allclose(out, torch.cat([ref_qkv[:, qs], ref_qkv[:, ks], ref_qkv[:, vs]], 1))
        out = mlp.linear_method.apply(mlp, x, None)      # [gate 48 | up 48] of this rank
        gs, us = slice(rank * 48, rank * 48 + 48), slice(96 + rank * 48, 96 + rank * 48 + 48)
        assert torch.allclose(out, torch.cat([ref_mlp[:, gs], ref_mlp[:, us]], 1))
