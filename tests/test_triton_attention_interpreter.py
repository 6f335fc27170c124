"""The Triton attention kernels' logic on CPU, under the Triton interpreter
(TRITON_INTERPRET=1).

The interpreter is chosen when a kernel is decorated, i.e. when autoglm_serve.kernels.paged_attention
is first imported, so this module sets the variable before importing it. On a machine with CUDA it
skips itself without touching the environment: there tests/test_triton_attention.py runs the same
kernels compiled. Shapes are tiny (the interpreter runs each program in numpy) but cover every
branch: split-K with and without merge, page lookups across block sizes, non-power-of-two head
dims and GQA groups, cached prefixes, mixed batches and padding rows.
"""
from __future__ import annotations

import os
import sys

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("CUDA present: the compiled kernels are tested by test_triton_attention.py",
                allow_module_level=True)
# Before the first `import triton`: triton.language's own helpers (tl.cdiv, tl.sum ...) are
# decorated at its import too.
os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")
if not triton.knobs.runtime.interpret or not isinstance(
        triton.language.standard.cdiv, triton.runtime.interpreter.InterpretedFunction):
    pytest.skip("triton was imported before TRITON_INTERPRET=1 was set: run this module alone, "
                "or set TRITON_INTERPRET=1 in the environment (or a conftest)",
                allow_module_level=True)

import triton.runtime.interpreter as interpreter  # noqa: E402

from autoglm_serve.models.layers.triton_attention import TritonAttentionBackend  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from paged_attention_cases import (  # noqa: E402
    check_backend, check_backend_with_rotary, check_decode_merge, make_batch)
from triton_interpreter_fixes import fix_interpreter  # noqa: E402


@pytest.fixture(autouse=True)
def _interpreter_fixes(monkeypatch):
    fix_interpreter(monkeypatch)   # bugs of the Triton 3.6 interpreter, not of the kernels


@pytest.fixture
def backend():
    return TritonAttentionBackend()


def test_kernels_are_interpreted():
    from autoglm_serve.kernels import paged_attention
    assert isinstance(paged_attention._decode_kernel, interpreter.InterpretedFunction)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [16, 32, 64])
def test_decode_split_k(backend, dtype, block_size):
    # Lengths below one tile, across a partition boundary and over several partitions.
    b = make_batch([1, 37, 300, 700], [], num_heads=8, num_kv_heads=2, head_dim=32,
                   block_size=block_size, dtype=dtype, device="cpu")
    check_backend(backend, b)


def test_decode_partition_counts(backend):
    # Same batch with the split-K grid forced to 1 (direct write) and to 8 (partials merged).
    b = make_batch([90, 520], [], num_heads=4, num_kv_heads=1, head_dim=16, block_size=16,
                   dtype=torch.float32, device="cpu")
    for parts in (1, 8):
        backend.max_decode_partitions = parts
        check_backend(backend, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("partitions,min_chunk,lens", [
    (1, 256, [300, 5]),         # one partition: written directly, no merge
    (4, 64, [250, 40, 1]),      # several: 4 x 64 tokens for 250
    (16, 64, [1000, 129]),      # many: 16 x 64 tokens for 1000
    (2, 256, [700, 256, 257]),  # a wide minimum chunk: 2 x 384 for 700
])
def test_decode_merge_in_kernel(dtype, partitions, min_chunk, lens):
    from autoglm_serve.kernels.paged_attention import DecodeSplit
    b = make_batch(lens, [], num_heads=8, num_kv_heads=2, head_dim=16, block_size=16,
                   dtype=dtype, device="cpu", padding_rows=1)
    check_decode_merge(DecodeSplit(partitions, min_chunk, 132), b)


def test_decode_partitions_capped_per_sm():
    # DECODE_TILES uses at most 3 programs per SM: 3 x 5 SMs over 3 x 2 (sequence, KV head)
    # pairs = 3 of the grid's 16 partitions, a count that is no power of two
    from autoglm_serve.kernels.paged_attention import DECODE_TILES, DecodeSplit
    assert DECODE_TILES.fill_programs == 3
    b = make_batch([1000, 300, 1], [], num_heads=8, num_kv_heads=2, head_dim=16, block_size=16,
                   dtype=torch.float32, device="cpu")
    check_decode_merge(DecodeSplit(16, 64, 5), b)


@pytest.mark.parametrize("lens", [[700], [700, 300]], ids=["one_sequence", "two"])
def test_decode_small_batch_tiles(lens):
    # 700 tokens over 11 one-tile partitions of the 64, merged 16 partial rows at a load for
    # one sequence (the last load part masked), 4 for two (and a padding row)
    from autoglm_serve.kernels.paged_attention import SMALL_BATCH_DECODE_TILES, decode_split
    assert SMALL_BATCH_DECODE_TILES.parts_scale == 2.0
    b = make_batch(lens, [], num_heads=8, num_kv_heads=2, head_dim=16, block_size=16,
                   dtype=torch.float32, device="cpu", padding_rows=1)
    split = decode_split(len(lens), 2, 132)
    assert split.tiles.merge_tile == (16 if len(lens) == 1 else 4)
    check_decode_merge(split, b)


def test_decode_split_from_the_batch_shape():
    # An H200 (132 SMs), 2 KV heads: batch 1 spreads over the whole grid in one-tile chunks;
    # once the (sequence, KV head) pairs fill the SMs, chunks are 256 tokens and the grid narrows.
    # Up to 2 sequences (4 pairs) take the small-batch tiles, one sequence its wider merge.
    from autoglm_serve.kernels.paged_attention import (DECODE_TILES, ONE_SEQUENCE_DECODE_TILES,
                                                       SMALL_BATCH_DECODE_TILES, DecodeSplit,
                                                       decode_split)
    assert decode_split(1, 2, 132) == DecodeSplit(64, 64, 132, ONE_SEQUENCE_DECODE_TILES)
    assert decode_split(2, 2, 132) == DecodeSplit(64, 64, 132, SMALL_BATCH_DECODE_TILES)
    assert decode_split(3, 2, 132) == DecodeSplit(64, 64, 132, DECODE_TILES)
    assert decode_split(8, 2, 132) == DecodeSplit(64, 64, 132, DECODE_TILES)
    assert decode_split(66, 2, 132) == DecodeSplit(4, 256, 132)
    assert decode_split(1024, 2, 132) == DecodeSplit(1, 256, 132)


@pytest.mark.parametrize("group", [1, 3, 16])
def test_decode_gqa_groups(backend, group):
    b = make_batch([20, 270], [], num_heads=2 * group, num_kv_heads=2, head_dim=16,
                   block_size=16, dtype=torch.float32, device="cpu", padding_rows=2)
    check_backend(backend, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_without_prefix(backend, dtype):
    b = make_batch([], [(0, 1), (0, 70), (0, 130)], num_heads=4, num_kv_heads=2, head_dim=32,
                   block_size=16, dtype=dtype, device="cpu")
    check_backend(backend, b)


@pytest.mark.parametrize("block_size", [16, 64])
def test_prefill_with_cached_prefix(backend, block_size):
    # Prefixes that end mid-page, on a page boundary and beyond one key tile.
    b = make_batch([], [(5, 20), (64, 9), (150, 33)], num_heads=8, num_kv_heads=2, head_dim=32,
                   block_size=block_size, dtype=torch.float32, device="cpu")
    check_backend(backend, b)


@pytest.mark.parametrize("dtype,block_size", [(torch.float32, 64), (torch.bfloat16, 64),
                                              (torch.bfloat16, 128)])
def test_prefill_through_tma_boxes(backend, dtype, block_size):
    # Pages of whole key tiles: each K/V tile is one TMA box (interpreted here); a page's slots
    # past its sequence hold NaN, which the causal tiles load and must keep out of the output.
    # AutoGLM's GQA group of 16, so a tile's 128 rows are 8 tokens.
    from autoglm_serve.kernels.paged_prefill import prefill_tma_supported
    b = make_batch([7], [(5, 20), (64, 9), (150, 33), (0, 130)], num_heads=32, num_kv_heads=2,
                   head_dim=32, block_size=block_size, dtype=dtype, device="cpu")
    assert prefill_tma_supported(b.kv_cache, dtype)
    check_backend(backend, b)


@pytest.mark.parametrize("head_dim", [16, 24, 80])
def test_non_power_of_two_head_dims(backend, head_dim):
    b = make_batch([40], [(10, 12)], num_heads=6, num_kv_heads=2, head_dim=head_dim,
                   block_size=16, dtype=torch.float32, device="cpu")
    check_backend(backend, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_mixed_batch_with_padding(backend, dtype):
    b = make_batch([3, 290], [(40, 17), (0, 5)], num_heads=16, num_kv_heads=1, head_dim=16,
                   block_size=32, dtype=dtype, device="cpu", padding_rows=1)
    check_backend(backend, b)


def test_prefill_row_with_zero_seq_len_writes_zeros(backend):
    b = make_batch([], [(0, 4)], num_heads=2, num_kv_heads=1, head_dim=16, block_size=16,
                   dtype=torch.float32, device="cpu")
    b.meta.seq_lens.zero_()
    b.meta.seq_lens_cpu.zero_()
    b.meta.slot_mapping.fill_(-1)
    cache = b.kv_cache.clone()
    out = backend.forward(b.q, b.k, b.v, cache, b.meta, b.scale,
                          out=torch.full_like(b.q, float("nan")))
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(cache.isnan(), b.kv_cache.isnan())  # slot -1: nothing written


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("interleaved,head_dim,rotary_dim", [(True, 32, 16), (False, 16, 16),
                                                             (False, 24, 12)])
def test_rotary_fused_into_kv_write(backend, dtype, interleaved, head_dim, rotary_dim):
    # GLM's partial interleaved pairs, Llama's full half-split ones, a non-power-of-two half;
    # decodes, a padding row and a prefill with a cached prefix in one batch.
    from autoglm_serve.models.layers.rotary import RotaryEmbedding
    rotary = RotaryEmbedding(head_dim, rotary_dim, 1024, 10000.0, interleaved)
    b = make_batch([1, 40], [(20, 5)], num_heads=6, num_kv_heads=2, head_dim=head_dim,
                   block_size=16, dtype=dtype, device="cpu", padding_rows=1)
    check_backend_with_rotary(backend, b, rotary)


def test_rotary_fused_into_kv_write_mrope_strided_tables(backend):
    # M-RoPE positions per frequency section; cos/sin tables whose rows are strided
    from autoglm_serve.models.glm4v import MRotaryEmbedding
    rotary = MRotaryEmbedding(32, 16, 1024, 10000.0, [2, 3, 3])
    b = make_batch([30, 70], [(0, 9)], num_heads=4, num_kv_heads=2, head_dim=32, block_size=16,
                   dtype=torch.float32, device="cpu", padding_rows=1)
    positions = torch.randint(0, 1024, (3, b.q.shape[0]))
    check_backend_with_rotary(backend, b, rotary, positions, column_major_tables=True)


@pytest.mark.parametrize("num_decodes", [1, 3])
def test_rotary_fused_into_kv_write_decode_only(backend, num_decodes):
    from autoglm_serve.models.layers.rotary import RotaryEmbedding
    rotary = RotaryEmbedding(32, 16, 1024, 10000.0, interleaved=True)
    b = make_batch([7, 70, 130][:num_decodes], [], num_heads=8, num_kv_heads=2, head_dim=32,
                   block_size=16, dtype=torch.float32, device="cpu", padding_rows=2)
    check_backend_with_rotary(backend, b, rotary)


@pytest.mark.parametrize("arch", ["llama", "glm4"])
def test_engine_with_triton_backend_matches_torch(tmp_path, arch):
    """The Triton backend end to end (rotary fused into the KV write, the split-K merge inside
    the decode kernel) against the PyTorch backend on one tiny checkpoint: a batch, then a lone
    150-token request whose decodes split into partitions. Greedy tokens identical."""
    from autoglm_serve import LLM, SamplingParams
    from tests.tiny_models import build_tiny_decoder
    path, _ = build_tiny_decoder(tmp_path / arch, arch, vocab_size=256)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    batches = [[[3 + i % 200 for i in range(n)] for n in (1, 7, 40)],
               [[5 + i % 190 for i in range(150)]]]
    results = {}
    for backend in ("torch", "triton"):
        llm = LLM(str(path), skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
                  attention_backend=backend, block_size=16, kv_cache_memory_gib=0.05)
        results[backend] = [o.outputs[0].token_ids for prompts in batches
                            for o in llm.generate(prompts, params)]
    assert results["triton"] == results["torch"]


def test_self_check_failure_falls_back_to_the_torch_backend(tmp_path, monkeypatch):
    from autoglm_serve import LLM
    from tests.tiny_models import build_tiny_decoder
    path, _ = build_tiny_decoder(tmp_path, "glm4", vocab_size=256)
    llm = LLM(str(path), skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
              attention_backend="triton", block_size=16, kv_cache_memory_gib=0.05)
    runner = llm.engine.core.runner
    runner.check_backend()   # the real kernels pass
    assert runner.backend.name == "triton"
    monkeypatch.setattr(TritonAttentionBackend, "forward",
                        lambda self, q, *args, **kwargs: torch.zeros_like(q))
    runner.check_backend()
    assert runner.backend.name == "torch"
    assert all(layer.backend is runner.backend for layer in runner.attention_layers)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("interleaved,head_dim,rotary_dim", [(True, 32, 16), (False, 16, 16)])
def test_decode_kernel_writes_kv_as_the_write_kernel(dtype, interleaved, head_dim, rotary_dim):
    # A batch of decodes alone: the decode kernel rotates q and k itself and writes the K/V.
    # The cache must be bit for bit the write kernel's, the outputs those of the two-launch
    # path (a one-token context, a partition boundary, split-K, a padding row).
    from autoglm_serve.models.layers.attention import Rope
    from autoglm_serve.models.layers.rotary import RotaryEmbedding
    rotary = RotaryEmbedding(head_dim, rotary_dim, 1024, 10000.0, interleaved)
    b = make_batch([1, 64, 65, 700], [], num_heads=4, num_kv_heads=2, head_dim=head_dim,
                   block_size=16, dtype=dtype, device="cpu", padding_rows=1)
    rope = Rope(*rotary.cos_sin(torch.randint(0, 1024, (b.q.shape[0],))), interleaved)
    results = []
    for fused in (True, False):
        cache, q = b.kv_cache.clone(), b.q.clone()
        out = torch.full_like(q, float("nan"))
        TritonAttentionBackend(fuse_decode_kv_write=fused).forward(
            q, b.k, b.v, cache, b.meta, b.scale, out=out, rope=rope)
        results.append((out, cache, q))
    (out, cache, q), (ref_out, ref_cache, _) = results
    assert torch.equal(cache.isnan(), ref_cache.isnan())
    assert torch.equal(cache.nan_to_num(0.0), ref_cache.nan_to_num(0.0))
    assert not out[:4].isnan().any() and not out[4].any()    # the padding row: zeros
    assert (out - ref_out).abs().max() < (1e-5 if dtype == torch.float32 else 2e-2)
    assert torch.equal(q, b.q), "q is rotated in registers, not in place"


def test_self_check_compares_the_decode_kernels_write(monkeypatch):
    from autoglm_serve.kernels.paged_attention import NewTokenKV
    from autoglm_serve.models.layers import triton_attention
    backend = TritonAttentionBackend()
    assert backend.self_check(torch.device("cpu"), torch.float32, 4, 2, 32)
    # the decode kernel's K/V written to the wrong slot: the self-check must see it
    monkeypatch.setattr(triton_attention, "NewTokenKV", lambda k, v, slots, *rope: NewTokenKV(
        k, v, torch.zeros_like(slots), *rope))
    assert not backend.self_check(torch.device("cpu"), torch.float32, 4, 2, 32)


def test_decode_kernel_writes_nothing_for_slot_minus_one():
    # A CUDA graph's capture runs its decode rows with a context and slot -1: the decode kernel
    # must write no K/V for them (as the write kernel), not below slot 0 into other memory.
    b = make_batch([40, 70], [], num_heads=4, num_kv_heads=2, head_dim=16, block_size=16,
                   dtype=torch.float32, device="cpu")
    b.meta.slot_mapping[0] = -1
    arena = torch.full((3,) + b.kv_cache.shape, 7.0)     # the cache with memory on both sides
    arena[1] = b.kv_cache
    out = torch.full_like(b.q, float("nan"))
    TritonAttentionBackend().forward(b.q, b.k, b.v, arena[1], b.meta, b.scale, out=out)
    assert torch.equal(arena[0], torch.full_like(arena[0], 7.0))
    assert torch.equal(arena[2], torch.full_like(arena[2], 7.0))
    written = arena[1].nan_to_num(0.0) != b.kv_cache.nan_to_num(0.0)
    slot = int(b.meta.slot_mapping[1])
    expected = torch.zeros_like(written)
    expected[:, slot // 16, :, slot % 16] = True
    assert torch.equal(written | expected, expected), "written outside row 1's slot"
    assert not out.isnan().any()


@pytest.mark.parametrize("fused", [True, False], ids=["rotary_in_the_kernel", "rotary_before"])
def test_attend_writes_into_the_callers_buffer(monkeypatch, fused):
    """Attention.attend(..., out=rows): the attention between two pieces of a prompt step's
    CUDA graphs (engine/core/prompt_graphs.py), which read its output from a static buffer.
    The result lands in those rows (written there by the kernels, or copied where the backend
    does not take rotary) with forward's values, and the buffer's rows past the step stay as
    they were."""
    from autoglm_serve.models.layers.attention import Attention
    from autoglm_serve.models.layers.rotary import RotaryEmbedding
    b = make_batch([9, 20], [(0, 11), (16, 7)], num_heads=4, num_kv_heads=2, head_dim=32,
                   block_size=16, dtype=torch.float32, device="cpu")
    rotary = RotaryEmbedding(32, 16, 256, 10000.0, interleaved=True)
    layer = Attention(4, 2, 32, b.scale, rotary)
    layer.backend = TritonAttentionBackend()
    monkeypatch.setattr(layer.backend, "fuses_rotary", lambda: fused)
    t = b.q.shape[0]
    rope = rotary.cos_sin(torch.randint(0, 256, (t,), generator=torch.Generator().manual_seed(0)))
    q, k, v = (x.reshape(t, -1) for x in (b.q, b.k, b.v))
    layer.kv_cache = b.kv_cache.clone()
    ref = layer.forward(q.clone(), k.clone(), v.clone(), b.meta, rope)
    layer.kv_cache = b.kv_cache.clone()
    static = torch.full((t + 5, q.shape[1]), float("nan"))     # a larger graph size's rows
    got = layer.attend(q.clone(), k.clone(), v.clone(), b.meta, rope, out=static[:t])
    assert got.data_ptr() == static.data_ptr() and got.shape == ref.shape
    assert torch.equal(got[b.valid_rows], ref[b.valid_rows])
    assert not got[b.valid_rows].isnan().any() and static[t:].isnan().all()
