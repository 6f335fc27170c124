"""A long chunk's attention through SDPA (models/layers/dense_prefill.py) against one masked
float64 softmax over the same keys: from the first token, and after cached context, on a CPU
(torch's flash kernel) and on a GPU (cuDNN's)."""
from __future__ import annotations

import pytest
import torch

from autoglm_serve.models.layers.dense_prefill import chunk_attention

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def masked_reference(q, keys, values, context: int, scale: float) -> torch.Tensor:
    group = q.shape[1] // keys.shape[1]
    k = keys.double().repeat_interleave(group, dim=1)
    v = values.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("lhd,shd->hls", q.double(), k) * scale
    pos = torch.arange(q.shape[0], device=q.device)[:, None] + context
    visible = torch.arange(keys.shape[0], device=q.device)[None, :] <= pos
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hls,shd->lhd", scores.softmax(-1), v)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("context,length", [(0, 96), (1, 64), (300, 77), (2048, 256)])
def test_chunk_attention_matches_masked_softmax(device, dtype, context, length):
    if dtype == torch.float32 and device == "cuda":
        pytest.skip("cuDNN's attention takes 16-bit inputs")
    g = torch.Generator().manual_seed(context + length)
    heads, kv_heads, head_dim = 8, 2, 64
    q = torch.randn(length, heads, head_dim, generator=g).to(device, dtype)
    keys, values = (torch.randn(context + length, kv_heads, head_dim, generator=g).to(device, dtype)
                    for _ in range(2))
    got = chunk_attention(q, keys, values, context, head_dim ** -0.5)
    want = masked_reference(q, keys, values, context, head_dim ** -0.5)
    assert got.dtype == dtype and got.shape == q.shape
    err = ((got.double() - want).norm() / want.norm()).item()
    assert err < (1e-5 if dtype == torch.float32 else 1e-2), f"relative error {err:.2e}"
