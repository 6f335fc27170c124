"""The torch backend's prefill attention against one masked SDPA over float32 copies: a prompt
from its start (causal), and a chunk after cached context (all of the context, the chunk
causally), with GQA, in float32 and bf16."""
import pytest
import torch
import torch.nn.functional as F

from autoglm_serve.models.layers.torch_attention import TorchAttentionBackend

HKV, GROUP, D = 2, 3, 32
SCALE = D ** -0.5


def reference(q, k, v, offset):
    lq, lk = q.shape[0], k.shape[0]
    mask = torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + offset
    qh, kh, vh = (x.float().transpose(0, 1) for x in (q, k.repeat_interleave(GROUP, 1),
                                                      v.repeat_interleave(GROUP, 1)))
    return F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=SCALE).transpose(0, 1)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("chunk,context", [(37, 0), (1, 90), (16, 300), (200, 57)])
def test_prefill_matches_masked_sdpa(dtype, tol, chunk, context):
    gen = torch.Generator().manual_seed(chunk * 1000 + context)
    q = torch.randn(chunk, HKV * GROUP, D, generator=gen).to(dtype)
    k = torch.randn(context + chunk, HKV, D, generator=gen).to(dtype)
    v = torch.randn(context + chunk, HKV, D, generator=gen).to(dtype)
    got = TorchAttentionBackend._attend(q, k, v, GROUP, SCALE, causal_offset=context)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), reference(q, k, v, context), atol=tol, rtol=tol)
