"""The CPU decode-attention kernel (kernels/cpu/decode_attention.c) against torch's CPU flash
kernel (outputs and log-sum-exps), with GQA groups, head sizes and lengths around its chunks of
256 tokens, and the same bits at any thread count. The torch backend's use of it (in-place
reads of long float32 contexts) is tested in test_torch_attention_decode.py."""
import pytest
import torch

from autoglm_serve.kernels.cpu.decode_attention import available, decode_attention, supports

pytestmark = pytest.mark.skipif(not available(), reason="no AVX2 or no C compiler")


def flash(q, k, v, scale):
    hkv, _, d = k.shape
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q.view(1, hkv, -1, d), k[None], v[None], scale=scale)[:2]
    return out.reshape(-1, d), lse.reshape(-1)


@pytest.mark.parametrize("hkv,group,d", [(3, 3, 64), (2, 6, 128), (4, 1, 32), (1, 16, 72)])
@pytest.mark.parametrize("tokens", [1, 7, 256, 257, 1000, 4000])
def test_matches_torchs_flash_kernel(hkv, group, d, tokens):
    gen = torch.Generator().manual_seed(tokens * 31 + d)
    k, v = torch.randn(2, hkv, tokens, d, generator=gen) * 2
    q = torch.randn(hkv * group, d, generator=gen)
    assert supports(k, v, q)
    out, lse = decode_attention(q, k, v, d ** -0.5)
    ref_out, ref_lse = flash(q, k, v, d ** -0.5)
    torch.testing.assert_close(out, ref_out, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=2e-6, rtol=1e-6)


def test_reads_each_heads_run_through_its_stride():
    """A run of the heads-first cache: [Hkv, tokens, D] views into a larger buffer."""
    cache = torch.randn(2, 3, 900, 64)
    k, v = cache[0, :, 100:700], cache[1, :, 100:700]
    q = torch.randn(9, 64)
    assert supports(k, v, q) and not k.is_contiguous()
    out, _ = decode_attention(q, k, v, 0.125)
    torch.testing.assert_close(out, flash(q, k.contiguous(), v.contiguous(), 0.125)[0],
                               atol=2e-6, rtol=1e-5)


def test_same_bits_at_any_thread_count():
    k, v = torch.randn(2, 3, 3000, 64)
    q = torch.randn(9, 64)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = decode_attention(q, k, v, 0.125)
        torch.set_num_threads(2)
        two = decode_attention(q, k, v, 0.125)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])


def test_what_it_does_not_take():
    k, v = torch.randn(2, 3, 100, 64)
    q = torch.randn(9, 64)
    assert not supports(k.bfloat16(), v.bfloat16(), q.bfloat16())
    assert not supports(k[:, ::2], v[:, ::2], q)                 # tokens not contiguous
    assert not supports(k[..., :12].contiguous(), v[..., :12].contiguous(),
                        q[:, :12].contiguous())                  # head size not a multiple of 8
    assert not supports(k[:1], v[:1], q.repeat(2, 1)[:17])       # 17 query heads a KV head
