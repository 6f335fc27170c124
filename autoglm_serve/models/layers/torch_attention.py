"""The reference attention backend in plain PyTorch: correct on CPU and CUDA, and the oracle
that faster backends are tested against."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from autoglm_serve.kernels.cpu import decode_attention as cpu_decode_attention
from autoglm_serve.models.layers.attention import AttentionBackend, AttentionMetadata


def write_kv_cache(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    rows, blocks, offsets = _slots(slot_mapping, kv_cache.shape[3])
    _store(k, v, kv_cache, rows, blocks, offsets)


def _slots(slot_mapping: torch.Tensor, block_size: int):
    """(rows with a slot, or None for all; their block ids; their offsets in the block)."""
    valid = slot_mapping >= 0
    rows = None
    if not bool(valid.all()):
        rows = valid.nonzero().squeeze(1)
        slot_mapping = slot_mapping[rows]
    return rows, slot_mapping // block_size, slot_mapping % block_size


def _store(k, v, kv_cache, rows, blocks, offsets) -> None:
    if rows is not None:
        k, v = k[rows], v[rows]
    if kv_cache.dtype == torch.float8_e4m3fn:   # saturate, as the GPU's cast does: not NaN
        k, v = k.clamp(-448.0, 448.0), v.clamp(-448.0, 448.0)
    kv_cache[0, blocks, :, offsets] = k.to(kv_cache.dtype)
    kv_cache[1, blocks, :, offsets] = v.to(kv_cache.dtype)


def gather_kv(kv_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int):
    """K and V of one sequence's first seq_len tokens: two [seq_len, Hkv, D] tensors."""
    block_size = kv_cache.shape[3]
    num_blocks = (seq_len + block_size - 1) // block_size
    blocks = block_table[:num_blocks].long()
    # [NB, Hkv, BS, D] -> [NB*BS, Hkv, D]
    k = kv_cache[0, blocks].transpose(1, 2).reshape(-1, kv_cache.shape[2], kv_cache.shape[4])
    v = kv_cache[1, blocks].transpose(1, 2).reshape(-1, kv_cache.shape[2], kv_cache.shape[4])
    return k[:seq_len], v[:seq_len]


@dataclass
class _StepPlan:
    """What every layer of one step takes from the metadata, derived once, at the first layer:
    on a CPU each small op costs microseconds, and SmolLM2's 30 layers repeated them all (host
    lists, the decode mask, the KV write's block ids)."""
    starts: list[int]
    seq_lens: list[int]
    write_rows: torch.Tensor | None     # rows of this step's k/v that have a slot; None: all
    write_blocks: torch.Tensor
    write_offsets: torch.Tensor
    decode: "_DecodePlan | None"


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def __init__(self):
        self._plan_meta: AttentionMetadata | None = None
        self._plan: _StepPlan | None = None

    def _step_plan(self, meta: AttentionMetadata, kv_cache: torch.Tensor,
                   dtype: torch.dtype) -> _StepPlan:
        if meta is not self._plan_meta:
            self._plan_meta, self._plan = meta, _make_plan(meta, kv_cache, dtype)
        return self._plan

    def forward(self, q, k, v, kv_cache, meta: AttentionMetadata, scale: float):
        plan = self._step_plan(meta, kv_cache, _matmul_dtype(kv_cache, q))
        _store(k, v, kv_cache, plan.write_rows, plan.write_blocks, plan.write_offsets)
        num_heads, num_kv_heads = q.shape[1], k.shape[1]
        group = num_heads // num_kv_heads
        nd = meta.num_decodes
        if nd == meta.num_seqs and nd == q.shape[0]:    # decodes only: no copy into `out`
            return _decode(q, kv_cache, plan.decode, group, scale)
        out = torch.empty_like(q)
        if nd > 0:
            out[:nd] = _decode(q[:nd], kv_cache, plan.decode, group, scale)
        for i in range(nd, meta.num_seqs):
            s, e, seq_len = plan.starts[i], plan.starts[i + 1], plan.seq_lens[i]
            if e == s or seq_len == 0:
                continue
            ks, vs = gather_kv(kv_cache, meta.block_tables[i], seq_len)
            out[s:e] = self._attend(q[s:e], ks, vs, group, scale, causal_offset=seq_len - (e - s))
        return out

    @staticmethod
    def _attend(q, k, v, group, scale, causal_offset):
        # q: [Lq, H, D], k/v: [Lk, Hkv, D]; query i sits at absolute position causal_offset + i.
        # 4-D, in the cache's dtype: a CPU takes 3-D inputs to SDPA's math path (4.4x slower at
        # 1,000 tokens than its flash kernel), and bf16 flash keeps float32 sums (2.7x faster)
        dtype = _matmul_dtype(k, q)
        qh, kh, vh = (x.to(dtype).transpose(0, 1)[None] for x in (q, k, v))
        if causal_offset == 0:
            o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale,
                                               enable_gqa=group > 1)
        elif q.device.type == "cpu":
            # a chunk after cached context: every query sees all of the context, and the chunk
            # causally, merged by log-sum-exp; one masked SDPA computed every masked score
            c = causal_offset
            o = _merge_by_lse([_flash_cpu(qh, kh[:, :, :c], vh[:, :, :c], scale),
                               _flash_cpu(qh, kh[:, :, c:], vh[:, :, c:], scale, causal=True)])
        else:
            lq, lk = q.shape[0], k.shape[0]
            q_pos = torch.arange(lq, device=q.device)[:, None] + causal_offset
            mask = torch.arange(lk, device=q.device)[None, :] <= q_pos
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale,
                                               enable_gqa=group > 1)
        return o[0].transpose(0, 1).to(q.dtype)


def _flash_cpu(q, k, v, scale: float, causal: bool = False):
    """(out, log-sum-exp) of torch's CPU flash kernel, which takes fewer KV heads than query
    heads (GQA) as they are."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=causal,
                                                                      scale=scale)[:2]


def _merge_by_lse(parts) -> torch.Tensor:
    """Attention over the union of disjoint key sets from each set's (out [..., L, D],
    log-sum-exp [..., L]); float32."""
    lse = torch.stack([p[1] for p in parts])
    weights = torch.exp(lse - torch.logsumexp(lse, dim=0)).unsqueeze(-1)
    return (torch.stack([p[0].float() for p in parts]) * weights).sum(dim=0)


# From this context length a CPU decode reads each sequence's KV blocks where they lie: at
# 4,000 tokens the copy into a gathered batch cost as much as the attention itself.
IN_PLACE_MIN_TOKENS = 512
MAX_RUNS = 16   # runs of consecutive blocks read in place; more fragmented: gathered


@dataclass
class _InPlaceRead:
    runs: list[tuple[int, int]]     # (first block, tokens) of each run, in the table's order


@dataclass
class _DecodePlan:
    """How this step's decode rows read the cache: each in place (long CPU contexts), or all
    gathered into one batch."""
    in_place: list[_InPlaceRead | None] | None     # None: gathered; an entry None: seq_len 0
    num_blocks: int = 0
    index: torch.Tensor | None = None   # [rows * num_blocks] block ids to gather
    # [rows, 1, 1, num_blocks * BS]: 0 where a row sees the key, -inf where not (SDPA turns a
    # boolean mask into this at every call: two ops a layer)
    mask: torch.Tensor | None = None
    empty_rows: torch.Tensor | None = None  # rows without a key (padding), whose output is 0


def _make_plan(meta: AttentionMetadata, kv_cache: torch.Tensor, dtype: torch.dtype) -> _StepPlan:
    seq_lens = meta.seq_lens_cpu.tolist()
    rows, blocks, offsets = _slots(meta.slot_mapping, kv_cache.shape[3])
    nd = meta.num_decodes
    decode = _decode_plan(meta.block_tables[:nd], seq_lens[:nd], kv_cache, dtype) if nd else None
    return _StepPlan(meta.query_start_loc_cpu.tolist(), seq_lens, rows, blocks, offsets, decode)


def _decode_plan(block_tables, seq_lens: list[int], kv_cache, dtype: torch.dtype) -> _DecodePlan:
    block_size = kv_cache.shape[3]
    if kv_cache.device.type == "cpu" and max(seq_lens) >= IN_PLACE_MIN_TOKENS:
        reads = _in_place_reads(block_tables.tolist(), seq_lens, block_size)
        if reads is not None:
            return _DecodePlan(in_place=reads)
    num_blocks = -(-max(seq_lens) // block_size)
    if num_blocks == 0:
        return _DecodePlan(in_place=None)
    device = block_tables.device
    lens = torch.tensor(seq_lens, device=device)
    hidden = torch.arange(num_blocks * block_size, device=device)[None, :] >= lens[:, None]
    mask = torch.zeros(hidden.shape, dtype=dtype, device=device).masked_fill_(hidden, -math.inf)
    return _DecodePlan(
        in_place=None, num_blocks=num_blocks,
        index=block_tables[:, :num_blocks].clamp(min=0).reshape(-1).long(),
        mask=mask[:, None, None, :],
        empty_rows=(lens == 0).nonzero().squeeze(1) if min(seq_lens) == 0 else None)


def _in_place_reads(tables: list[list[int]], seq_lens: list[int],
                    block_size: int) -> list[_InPlaceRead | None] | None:
    """Each row's runs of blocks, or None when a row's are too scattered for that to pay."""
    reads = []
    for table, n in zip(tables, seq_lens):
        if n == 0:
            reads.append(None)
            continue
        num_blocks = -(-n // block_size)
        runs = _block_runs(table[:num_blocks])
        if len(runs) > MAX_RUNS:
            return None
        # the last run ends with the sequence's last block, which holds its last tokens
        first, count = runs[-1]
        tokens = [(b, c * block_size) for b, c in runs[:-1]]
        tokens.append((first, n - (num_blocks - count) * block_size))
        reads.append(_InPlaceRead(tokens))
    return reads


def _decode(q, kv_cache, plan: _DecodePlan, group: int, scale: float) -> torch.Tensor:
    if plan.in_place is not None:
        return torch.stack([_decode_in_place(q[i], kv_cache, read, group, scale)
                            if read is not None else torch.zeros_like(q[i])
                            for i, read in enumerate(plan.in_place)])
    return _decode_gathered(q, kv_cache, plan, group, scale)


def _block_runs(blocks: list[int]) -> list[tuple[int, int]]:
    """(first block, count) of each run of consecutive ids, in the table's order."""
    runs: list[list[int]] = []
    for b in blocks:
        if runs and b == runs[-1][0] + runs[-1][1]:
            runs[-1][1] += 1
        else:
            runs.append([b, 1])
    return [(a, c) for a, c in runs]


def _matmul_dtype(kv_cache: torch.Tensor, q: torch.Tensor) -> torch.dtype:
    """The cache's dtype, or the queries' for an fp8 cache (CPU matmuls take no fp8: read as
    16 or 32 bits, the values the GPU kernels see)."""
    return q.dtype if kv_cache.dtype == torch.float8_e4m3fn else kv_cache.dtype


def _run_view(kv_cache, which: int, first: int, tokens: int, dtype) -> torch.Tensor:
    """[1, Hkv, tokens, D]: a run's K (which=0) or V, a view where the cache is laid out heads
    first (new_kv_cache on a CPU); a copy otherwise."""
    _, _, hkv, block_size, d = kv_cache.shape
    blocks = -(-tokens // block_size)
    run = kv_cache[which, first:first + blocks].transpose(0, 1)            # [Hkv, c, BS, D]
    return run.reshape(1, hkv, blocks * block_size, d)[:, :, :tokens].to(dtype)


def _decode_in_place(q, kv_cache, read: _InPlaceRead, group: int, scale: float):
    """One sequence's decode over views of its runs of blocks, no copy of K or V. A float32
    cache goes through kernels/cpu/decode_attention.py (each key read once for the query heads
    that share it). Otherwise, one run: one SDPA with GQA (at 4,000 tokens, 30 cold layers: 23.2
    ms against 26.1 for the flash kernel with each KV head's G = H / Hkv query heads as G rows);
    several: that flash kernel over each. Several runs are merged by their log-sum-exps."""
    hkv, d = kv_cache.shape[2], kv_cache.shape[4]
    dtype = _matmul_dtype(kv_cache, q)
    runs = [(_run_view(kv_cache, 0, first, tokens, dtype)[0],
             _run_view(kv_cache, 1, first, tokens, dtype)[0]) for first, tokens in read.runs]
    if cpu_decode_attention.supports(*runs[0], q):
        parts = [cpu_decode_attention.decode_attention(q, k, v, scale) for k, v in runs]
        return parts[0][0] if len(parts) == 1 else _merge_by_lse(parts)
    if len(runs) == 1:
        k, v = runs[0]
        o = F.scaled_dot_product_attention(q.to(dtype).view(1, hkv * group, 1, d), k[None],
                                           v[None], scale=scale, enable_gqa=group > 1)
        return o.view(hkv * group, d).to(q.dtype)
    rows = q.to(dtype).view(1, hkv, group, d)
    out = _merge_by_lse([_flash_cpu(rows, k[None], v[None], scale) for k, v in runs])
    return out.view(hkv * group, d).to(q.dtype)


def _decode_gathered(q, kv_cache, plan: _DecodePlan, group: int, scale: float):
    """All decodes at once: their blocks gathered whole ([BS, D] tiles of each head by
    index_select, ~4x faster than advanced indexing into the cache), seen as [n, Hkv, L, D],
    then one SDPA with GQA under each row's length mask. At 16 rows of ~100 tokens on a CPU
    this took half the time of the per-block matmuls it replaced (0.38 against 0.72 ms a
    layer, bf16). The select runs along the heads-first view, contiguous on a CPU (a CPU
    index_select copies a strided source whole first: 2.2 ms a layer)."""
    if plan.num_blocks == 0:
        return torch.zeros_like(q)
    n, nb = q.shape[0], plan.num_blocks
    _, _, hkv, block_size, d = kv_cache.shape
    dtype = _matmul_dtype(kv_cache, q)
    kv = kv_cache.transpose(1, 2).index_select(2, plan.index).to(dtype)  # [2, Hkv, n*NB, BS, D]
    kv = kv.view(2, hkv, n, nb * block_size, d).transpose(1, 2)          # [2, n, Hkv, L, D]
    o = F.scaled_dot_product_attention(q.to(dtype).view(n, hkv * group, 1, d), kv[0], kv[1],
                                       attn_mask=plan.mask, scale=scale,
                                       enable_gqa=group > 1).view(n, hkv * group, d)
    if plan.empty_rows is not None:
        o[plan.empty_rows] = 0              # every key masked: SDPA gives NaN there
    return o.to(q.dtype)
