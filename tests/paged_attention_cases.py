"""Random paged-attention batches and the check of a backend against TorchAttentionBackend.

Shared by the GPU tests, the Triton-interpreter tests and scripts/gpu/attention_bench.py. Every cache
slot that no sequence has written yet holds NaN (as do pages nobody owns, which the unused tails of
the block tables point at), so a kernel that reads past a context or before writing leaks NaN
into its output; the oracle runs on the same cache with the NaN zeroed.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from autoglm_serve.models.layers.attention import AttentionMetadata, Rope
from autoglm_serve.models.layers.rotary import RotaryEmbedding
from autoglm_serve.models.layers.torch_attention import TorchAttentionBackend, write_kv_cache
from autoglm_serve.kernels.paged_attention import DecodeSplit
from autoglm_serve.models.layers.triton_attention import TritonAttentionBackend


@dataclass
class Batch:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kv_cache: torch.Tensor      # poisoned: NaN wherever nothing has been written
    meta: AttentionMetadata
    scale: float
    valid_rows: torch.Tensor    # bool [T]: rows whose output the oracle defines


def make_batch(decode_lens: list[int], prefills: list[tuple[int, int]], num_heads: int,
               num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype,
               device: str | torch.device, padding_rows: int = 0) -> Batch:
    """decode_lens: context lengths (including the new token) of the decode sequences;
    prefills: (cached prefix length, new query length) of each prefill sequence;
    padding_rows: CUDA-graph padding appended to the decodes (seq_len 0, slot -1)."""
    seqs = [(n - 1, 1) for n in decode_lens] + [(0, 1)] * padding_rows + list(prefills)
    num_decodes = len(decode_lens) + padding_rows
    padding = set(range(len(decode_lens), num_decodes))
    blocks_per_seq = [-(-(c + n) // block_size) for c, n in seqs]
    max_blocks = max([1] + blocks_per_seq)
    num_blocks = sum(blocks_per_seq) + 3                 # + spare pages nobody owns
    perm = torch.randperm(num_blocks)                    # scattered, non-monotonic pages
    poison_block = int(perm[-1])
    tables = torch.full((len(seqs), max_blocks), poison_block, dtype=torch.int32)
    cache = torch.full((2, num_blocks, num_kv_heads, block_size, head_dim), float("nan"),
                       dtype=dtype, device=device)
    slots, seq_lens, starts, used = [], [], [0], 0
    for i, (ctx, new) in enumerate(seqs):
        pages = perm[used:used + blocks_per_seq[i]]
        used += blocks_per_seq[i]
        tables[i, :len(pages)] = pages.to(torch.int32)
        prefix = torch.arange(ctx, device=device)  # the cached prefix, written by earlier steps
        for kv in range(2):
            cache[kv, pages.to(device)[prefix // block_size], :, prefix % block_size] = \
                torch.randn(ctx, num_kv_heads, head_dim, device=device).to(dtype)
        if i in padding:
            slots.append(-1)
            seq_lens.append(0)
        else:
            pos = torch.arange(ctx, ctx + new)
            slots.extend((pages[pos // block_size] * block_size + pos % block_size).tolist())
            seq_lens.append(ctx + new)
        starts.append(starts[-1] + new)
    t = starts[-1]
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32)
    starts_t = torch.tensor(starts, dtype=torch.int32)
    meta = AttentionMetadata(
        num_seqs=len(seqs), num_decodes=num_decodes, num_tokens=t,
        max_query_len=max([0] + [n for _, n in seqs]), max_seq_len=max([0] + seq_lens),
        query_start_loc=starts_t.to(device), seq_lens=seq_lens_t.to(device),
        block_tables=tables.to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc_cpu=starts_t, seq_lens_cpu=seq_lens_t)
    valid = torch.ones(t, dtype=torch.bool)
    for i in range(len(seqs)):
        if seq_lens[i] == 0 and i >= num_decodes:
            valid[starts[i]:starts[i + 1]] = False  # the oracle leaves these rows undefined
    q = torch.randn(t, num_heads, head_dim, dtype=dtype, device=device)
    k = torch.randn(t, num_kv_heads, head_dim, dtype=dtype, device=device)
    v = torch.randn(t, num_kv_heads, head_dim, dtype=dtype, device=device)
    return Batch(q, k, v, cache, meta, head_dim ** -0.5, valid.to(device))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 1e-2}


def check_backend(backend, batch: Batch) -> float:
    """Runs backend and the oracle on copies of the batch's cache; asserts that every output
    element was written (none left NaN), that padding rows are zero, that the cache holds exactly
    what the oracle wrote, and that the outputs agree. Returns the relative error."""
    cache = batch.kv_cache.clone()
    out = torch.full_like(batch.q, float("nan"))
    got = backend.forward(batch.q, batch.k, batch.v, cache, batch.meta, batch.scale, out=out)
    assert got.data_ptr() == out.data_ptr()
    ref_cache = batch.kv_cache.nan_to_num(0.0)
    ref = TorchAttentionBackend().forward(batch.q, batch.k, batch.v, ref_cache, batch.meta,
                                          batch.scale)
    assert not out[batch.valid_rows].isnan().any(), "output rows left unwritten or NaN"
    assert torch.equal(cache.nan_to_num(0.0), ref_cache), "KV cache write differs"
    err = rel_err(out[batch.valid_rows], ref[batch.valid_rows])
    assert err < TOLERANCE[batch.q.dtype], f"relative error {err:.2e}"
    return err


class FixedSplitBackend(TritonAttentionBackend):
    """The Triton backend with its decode split-K shape forced, whatever the batch."""

    def __init__(self, split: DecodeSplit):
        super().__init__()
        self.split = split

    def decode_split(self, num_decodes, num_kv_heads, device) -> DecodeSplit:
        return self.split


def check_decode_merge(split: DecodeSplit, batch: Batch) -> None:
    """Decode with a forced split-K shape, twice on the same backend: the merge must be right
    both times and leave every merge counter at zero (CUDA-graph replays rely on it)."""
    backend = FixedSplitBackend(split)
    for _ in range(2):
        check_backend(backend, batch)
        counters = backend.merge_counters(0, batch.q.device)
        assert not counters.any(), "merge counters not reset"


def check_backend_with_rotary(backend, batch: Batch, rotary: RotaryEmbedding,
                              positions: torch.Tensor | None = None,
                              column_major_tables: bool = False) -> float:
    """A backend that fuses rotary, fed un-rotated q/k plus this step's Rope, against the oracle
    fed q/k rotated by RotaryEmbedding's PyTorch path (on the CPU): the slots of this step must
    hold the oracle's rotated K and V and every other cache element must be untouched (padding
    rows write nothing), and the outputs must agree (which they cannot with q rotated wrong:
    whether q is rotated in place or in registers is the backend's business). Returns
    the output's relative error. positions (CPU; [T], or [3, T] for M-RoPE) are drawn at random
    unless given; column_major_tables hands the kernel cos/sin with strided rows."""
    device = batch.q.device
    if positions is None:
        positions = torch.randint(0, rotary.cos_cache.shape[0], (batch.q.shape[0],))
    cos, sin = rotary.cos_sin(positions)
    t = batch.q.shape[0]
    ref_q, ref_k = rotary.apply(batch.q.cpu().reshape(t, -1), batch.k.cpu().reshape(t, -1),
                                cos, sin)
    ref_q = ref_q.view_as(batch.q).to(device)
    ref_k = ref_k.view_as(batch.k).to(device)
    ref_cache = batch.kv_cache.clone()
    write_kv_cache(ref_k, batch.v, ref_cache, batch.meta.slot_mapping)

    q, cache = batch.q.clone(), batch.kv_cache.clone()
    out = torch.full_like(q, float("nan"))
    cos, sin = cos.to(device), sin.to(device)
    if column_major_tables:
        cos, sin = cos.t().contiguous().t(), sin.t().contiguous().t()
    backend.forward(q, batch.k.clone(), batch.v, cache, batch.meta, batch.scale, out=out,
                    rope=Rope(cos, sin, rotary.interleaved))
    tol = TOLERANCE[batch.q.dtype]
    slots = batch.meta.slot_mapping[batch.meta.slot_mapping >= 0]
    blocks, offsets = slots // cache.shape[3], slots % cache.shape[3]
    assert rel_err(cache[:, blocks, :, offsets], ref_cache[:, blocks, :, offsets]) < tol, \
        "rotated K / V written wrong"
    cache[:, blocks, :, offsets] = ref_cache[:, blocks, :, offsets]
    assert torch.equal(cache.isnan(), ref_cache.isnan()), "written outside this step's slots"
    assert torch.equal(cache.nan_to_num(0.0), ref_cache.nan_to_num(0.0))
    ref = TorchAttentionBackend().forward(ref_q, ref_k, batch.v, ref_cache.nan_to_num(0.0),
                                          batch.meta, batch.scale)
    assert not out[batch.valid_rows].isnan().any(), "output rows left unwritten or NaN"
    err = rel_err(out[batch.valid_rows], ref[batch.valid_rows])
    assert err < tol, f"relative error {err:.2e}"
    return err
