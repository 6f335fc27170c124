"""TritonAttentionBackend against TorchAttentionBackend on CUDA, at the model's real shapes
(32 query heads, 2 KV heads, head_dim 128) and around them: block sizes, GQA ratios, head dims,
dtypes, contexts from 1 to 32k tokens, mixed batches, padding rows and CUDA-graph replay.
Lengths are drawn fresh each run; a failure prints them. The CPU subset of these checks runs under
the Triton interpreter in test_triton_attention_interpreter.py."""
from __future__ import annotations

import os
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("triton")

from autoglm_serve.kernels.paged_attention import DecodeSplit  # noqa: E402
from autoglm_serve.models.glm4v import MRotaryEmbedding  # noqa: E402
from autoglm_serve.models.layers.attention import AttentionMetadata, Rope  # noqa: E402
from autoglm_serve.models.layers.rotary import RotaryEmbedding  # noqa: E402
from autoglm_serve.models.layers.torch_attention import (  # noqa: E402
    TorchAttentionBackend, gather_kv, write_kv_cache)
from autoglm_serve.models.layers.triton_attention import TritonAttentionBackend  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from paged_attention_cases import (  # noqa: E402
    TOLERANCE, check_backend, check_backend_with_rotary, check_decode_merge, make_batch, rel_err)

DEV = "cuda"
MODEL = dict(num_heads=32, num_kv_heads=2, head_dim=128)


def _lens(low: int, high: int, n: int) -> list[int]:
    return torch.randint(low, high + 1, (n,)).tolist()


@pytest.fixture
def backend():
    return TritonAttentionBackend()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("block_size", [16, 32, 64])
def test_decode_model_shapes(backend, dtype, block_size):
    lens = [1, 2, 63, 64, 65] + _lens(100, 600, 3) + _lens(1000, 9000, 3)
    b = make_batch(lens, [], block_size=block_size, dtype=dtype, device=DEV, **MODEL)
    check_backend(backend, b)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(8, 8), (16, 8), (16, 4), (24, 4), (32, 4),
                                                    (16, 1), (32, 2)])
@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256])
def test_decode_gqa_and_head_dims(backend, num_heads, num_kv_heads, head_dim):
    lens = _lens(1, 3000, 6)
    b = make_batch(lens, [], num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                   block_size=16, dtype=torch.bfloat16, device=DEV)
    check_backend(backend, b)


@pytest.mark.parametrize("batch", [1, 3, 64])
def test_decode_long_contexts(backend, batch):
    # Up to 32k tokens: all 64 split-K partitions busy at batch 1, none at batch 64.
    lens = [32768] + _lens(8000, 32768, batch - 1) if batch < 64 else _lens(1, 8192, batch)
    b = make_batch(lens, [], block_size=16, dtype=torch.bfloat16, device=DEV, **MODEL)
    check_backend(backend, b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("partitions,min_chunk", [(1, 256), (4, 64), (8, 256), (64, 64)])
def test_decode_merge_in_kernel(dtype, partitions, min_chunk):
    # One, several and many partitions merged by the last one to finish, twice in a row (the
    # counters must come back to zero); contexts from one token to 20k.
    lens = [1, 65, 700, 4096] + _lens(100, 20000, 4)
    b = make_batch(lens, [], block_size=16, dtype=dtype, device=DEV, padding_rows=2, **MODEL)
    check_decode_merge(DecodeSplit(partitions, min_chunk, 132), b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_self_check_passes_at_the_model_shapes(backend, dtype):
    assert backend.self_check(torch.device(DEV), dtype, **MODEL)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("block_size", [16, 64])
def test_prefill_without_prefix(backend, dtype, block_size):
    prefills = [(0, n) for n in [1, 7, 128, 129] + _lens(200, 4096, 3)]
    b = make_batch([], prefills, block_size=block_size, dtype=dtype, device=DEV, **MODEL)
    check_backend(backend, b)


@pytest.mark.parametrize("block_size", [16, 32, 64, 128])
def test_prefill_with_cached_prefix(backend, block_size):
    # Chunked prefill / prefix-cache hits: prefixes ending mid-page and on page boundaries
    # (pages of 64 and 128: TMA boxes on a Hopper GPU).
    prefills = [(4096, 4096), (64, 1), (31, 33), (block_size, 100)] + \
        [(c, n) for c, n in zip(_lens(1, 5000, 3), _lens(1, 700, 3))]
    b = make_batch([], prefills, block_size=block_size, dtype=torch.bfloat16, device=DEV,
                   **MODEL)
    check_backend(backend, b)


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(8, 8, 64), (16, 2, 96),
                                                             (12, 4, 80), (4, 1, 16)])
def test_prefill_gqa_and_head_dims(backend, num_heads, num_kv_heads, head_dim):
    prefills = list(zip(_lens(0, 1500, 4), _lens(1, 600, 4)))
    b = make_batch([], prefills, num_heads=num_heads, num_kv_heads=num_kv_heads,
                   head_dim=head_dim, block_size=32, dtype=torch.bfloat16, device=DEV)
    check_backend(backend, b)


@pytest.mark.parametrize("prefill", [(0, 32768), (24576, 8192)])
def test_prefill_32k(backend, prefill):
    # The oracle in 2k-query chunks: one SDPA call over 32k x 32k in fp32 would need ~128 GB.
    b = make_batch([], [prefill], block_size=64, dtype=torch.bfloat16, device=DEV, **MODEL)
    cache = b.kv_cache.clone()
    out = backend.forward(b.q, b.k, b.v, cache, b.meta, b.scale,
                          out=torch.full_like(b.q, float("nan")))
    ref_cache = b.kv_cache.nan_to_num(0.0)
    write_kv_cache(b.k, b.v, ref_cache, b.meta.slot_mapping)
    assert torch.equal(cache.nan_to_num(0.0), ref_cache)
    context, new = prefill
    ks, vs = gather_kv(ref_cache, b.meta.block_tables[0], context + new)
    group = MODEL["num_heads"] // MODEL["num_kv_heads"]
    ref = torch.empty_like(b.q)
    for s in range(0, new, 2048):
        e = min(new, s + 2048)
        ref[s:e] = TorchAttentionBackend._attend(b.q[s:e], ks[:context + e], vs[:context + e],
                                                 group, b.scale, causal_offset=context + s)
    assert not out.isnan().any()
    assert rel_err(out, ref) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_mixed_batch_with_padding(backend, dtype):
    decodes = _lens(1, 6000, 5)
    prefills = [(0, 300), (3000, 512)] + list(zip(_lens(0, 2000, 2), _lens(1, 300, 2)))
    b = make_batch(decodes, prefills, block_size=16, dtype=dtype, device=DEV, padding_rows=3,
                   **MODEL)
    check_backend(backend, b)


@pytest.mark.parametrize("fused_rotary", [False, True])
def test_cuda_graph_decode_replay(backend, fused_rotary):
    """Capture one decode step, then replay it on new contexts (longer, shorter, padding rows)
    copied into the same buffers: the launches must not depend on what was captured. With
    fused_rotary, q and k go in un-rotated with GLM's cos/sin, as in the model's graphs."""
    n, pad, block_size, dtype = 6, 2, 16, torch.bfloat16
    rotary = RotaryEmbedding(MODEL["head_dim"], MODEL["head_dim"] // 2, 40000, 10000.0,
                             interleaved=True)
    batches = [make_batch(_lens(1, 4000, n), [], block_size=block_size, dtype=dtype, device=DEV,
                          padding_rows=pad, **MODEL) for _ in range(2)]
    batches.append(make_batch([32768] + _lens(1, 9000, n - 1), [], block_size=block_size,
                              dtype=dtype, device=DEV, padding_rows=pad, **MODEL))
    num_blocks = max(b.kv_cache.shape[1] for b in batches)
    width = max(b.meta.block_tables.shape[1] for b in batches)
    cache = torch.empty((2, num_blocks) + batches[0].kv_cache.shape[2:], dtype=dtype, device=DEV)
    tables = torch.zeros((n + pad, width), dtype=torch.int32, device=DEV)
    q, k, v = (torch.empty_like(x) for x in (batches[0].q, batches[0].k, batches[0].v))
    cos = torch.empty(n + pad, MODEL["head_dim"] // 4, device=DEV)
    sin = torch.empty_like(cos)
    rope = Rope(cos, sin, interleaved=True) if fused_rotary else None
    m0 = batches[0].meta
    meta = AttentionMetadata(
        num_seqs=n + pad, num_decodes=n + pad, num_tokens=n + pad, max_query_len=1,
        max_seq_len=m0.max_seq_len, query_start_loc=m0.query_start_loc.clone(),
        seq_lens=m0.seq_lens.clone(), block_tables=tables, slot_mapping=m0.slot_mapping.clone(),
        query_start_loc_cpu=m0.query_start_loc_cpu, seq_lens_cpu=m0.seq_lens_cpu)
    out = torch.empty_like(q)

    def load(b):
        """Copies b into the graph's buffers; returns the q and k the oracle attends with."""
        cache.fill_(float("nan"))
        cache[:, :b.kv_cache.shape[1]] = b.kv_cache
        tables.zero_()
        tables[:, :b.meta.block_tables.shape[1]] = b.meta.block_tables
        meta.seq_lens.copy_(b.meta.seq_lens)
        meta.slot_mapping.copy_(b.meta.slot_mapping)
        for dst, src in ((q, b.q), (k, b.k), (v, b.v)):
            dst.copy_(src)
        out.fill_(float("nan"))
        if not fused_rotary:
            return b.q, b.k
        positions = meta.seq_lens.cpu().long().clamp(min=1) - 1
        c, s = rotary.cos_sin(positions)
        cos.copy_(c)
        sin.copy_(s)
        ref_q, ref_k = rotary.apply(b.q.cpu().flatten(1), b.k.cpu().flatten(1), c, s)
        return ref_q.view_as(b.q).to(DEV), ref_k.view_as(b.k).to(DEV)

    load(batches[0])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up compiles the kernels outside the capture
        backend.forward(q, k, v, cache, meta, batches[0].scale, out=out, rope=rope)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        backend.forward(q, k, v, cache, meta, batches[0].scale, out=out, rope=rope)

    for b in batches * 2:   # twice: replays must find the split-K counters reset
        ref_q, ref_k = load(b)
        graph.replay()
        ref_cache = b.kv_cache.nan_to_num(0.0)
        ref = TorchAttentionBackend().forward(ref_q, ref_k, b.v, ref_cache, b.meta, b.scale)
        assert not out.isnan().any()
        got_cache = cache[:, :b.kv_cache.shape[1]].nan_to_num(0.0)
        if fused_rotary:
            assert rel_err(got_cache, ref_cache) < TOLERANCE[dtype]
        else:
            assert torch.equal(got_cache, ref_cache)
        assert rel_err(out, ref) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("interleaved,rotary_dim", [(True, 64), (False, 128)])
@pytest.mark.parametrize("num_decodes", [1, 3, 64])
def test_rotary_fused_into_kv_write(backend, dtype, interleaved, rotary_dim, num_decodes):
    # GLM's partial interleaved rotary and Llama's full half-split one at the model's shapes,
    # decode-only batches with padding rows, and a mixed batch with prefill chunks.
    rotary = RotaryEmbedding(MODEL["head_dim"], rotary_dim, 32768, 10000.0, interleaved)
    prefills = [(0, 300), (1000, 77)] if num_decodes == 3 else []
    b = make_batch(_lens(1, 4000, num_decodes), prefills, block_size=16, dtype=dtype,
                   device=DEV, padding_rows=2, **MODEL)
    check_backend_with_rotary(backend, b, rotary)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rotary_fused_into_kv_write_mrope(backend, dtype):
    # AutoGLM-Phone-9B's M-RoPE: per-frequency positions from the temporal/height/width rows
    rotary = MRotaryEmbedding(MODEL["head_dim"], 64, 32768, 10000.0, [8, 12, 12])
    b = make_batch(_lens(1, 3000, 4), [(0, 200)], block_size=16, dtype=dtype, device=DEV,
                   **MODEL)
    positions = torch.randint(0, 3000, (3, b.q.shape[0]))
    check_backend_with_rotary(backend, b, rotary, positions)
    check_backend_with_rotary(backend, b, rotary, positions, column_major_tables=True)
