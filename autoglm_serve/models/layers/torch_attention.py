"""The reference attention backend in plain PyTorch: correct on CPU and CUDA, and the oracle
that faster backends are tested against."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from autoglm_serve.models.layers.attention import AttentionBackend, AttentionMetadata


def write_kv_cache(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    block_size = kv_cache.shape[3]
    valid = slot_mapping >= 0
    if not bool(valid.all()):
        k, v, slot_mapping = k[valid], v[valid], slot_mapping[valid]
    blocks = slot_mapping // block_size
    offsets = slot_mapping % block_size
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


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def forward(self, q, k, v, kv_cache, meta: AttentionMetadata, scale: float):
        write_kv_cache(k, v, kv_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        num_heads, num_kv_heads = q.shape[1], k.shape[1]
        group = num_heads // num_kv_heads
        starts = meta.query_start_loc_cpu.tolist()
        seq_lens = meta.seq_lens_cpu.tolist()
        nd = meta.num_decodes
        if nd > 0:
            out[:nd] = self._decode(q[:nd], kv_cache, meta.block_tables[:nd], seq_lens[:nd],
                                    group, scale)
        for i in range(nd, meta.num_seqs):
            s, e, seq_len = starts[i], starts[i + 1], seq_lens[i]
            if e == s or seq_len == 0:
                continue
            ks, vs = gather_kv(kv_cache, meta.block_tables[i], seq_len)
            out[s:e] = self._attend(q[s:e], ks, vs, group, scale, causal_offset=seq_len - (e - s))
        return out

    @staticmethod
    def _attend(q, k, v, group, scale, causal_offset):
        # q: [Lq, H, D], k/v: [Lk, Hkv, D]; query i sits at absolute position causal_offset + i.
        lq, lk = q.shape[0], k.shape[0]
        qh = q.transpose(0, 1).float()
        kh = k.transpose(0, 1).float()
        vh = v.transpose(0, 1).float()
        q_pos = torch.arange(lq, device=q.device)[:, None] + causal_offset
        k_pos = torch.arange(lk, device=q.device)[None, :]
        mask = k_pos <= q_pos
        # enable_gqa: query heads share their KV head without copying it `group` times
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale,
                                           enable_gqa=group > 1)
        return o.transpose(0, 1).to(q.dtype)

    @staticmethod
    def _decode(q, kv_cache, block_tables, seq_lens, group, scale):
        """Long CPU contexts: each sequence read in place (_decode_in_place); otherwise all
        decodes at once on their gathered blocks."""
        if q.device.type == "cpu" and max(seq_lens) >= IN_PLACE_MIN_TOKENS:
            tables = block_tables.tolist()
            block_size = kv_cache.shape[3]
            out = [_decode_in_place(q[i], kv_cache, tables[i][:-(-n // block_size)], n, group,
                                    scale) if n > 0 else torch.zeros_like(q[i])
                   for i, n in enumerate(seq_lens)]
            if all(o is not None for o in out):
                return torch.stack(out)
        return _decode_gathered(q, kv_cache, block_tables, seq_lens, group, scale)


# From this context length a CPU decode reads each sequence's KV blocks where they lie: at
# 4,000 tokens the copy into a gathered batch cost as much as the attention itself.
IN_PLACE_MIN_TOKENS = 512
MAX_RUNS = 16   # runs of consecutive blocks read in place; more fragmented: gathered


def _block_runs(blocks: list[int]) -> list[tuple[int, int]]:
    """(first block, count) of each run of consecutive ids, in ascending order."""
    runs: list[list[int]] = []
    for b in sorted(blocks):
        if runs and b == runs[-1][0] + runs[-1][1]:
            runs[-1][1] += 1
        else:
            runs.append([b, 1])
    return [(a, c) for a, c in runs]


def _matmul_dtype(kv_cache: torch.Tensor, q: torch.Tensor) -> torch.dtype:
    """The cache's dtype, or the queries' for an fp8 cache (CPU matmuls take no fp8: read as
    16 or 32 bits, the values the GPU kernels see)."""
    return q.dtype if kv_cache.dtype == torch.float8_e4m3fn else kv_cache.dtype


def _decode_in_place(q, kv_cache, blocks: list[int], seq_len: int, group: int, scale: float):
    """One sequence's decode over slices of the cache, no copy of K or V. Attention does not
    depend on the order of its keys (their positions are in them already, by RoPE), so the
    blocks are taken in id order: the allocator hands out and frees blocks in runs, and each
    run is one view. Only the last block's unwritten slots are masked. None when the blocks
    are too scattered for that to pay.

    A run [c, Hkv, BS, D] is contiguous, so it meets every query head in one GEMM, and each
    query head keeps its own KV head's scores (the diagonal): 3x the flops of per-head
    products, but one large matmul instead of c * Hkv tiny ones (at 4,000 tokens, bf16, one
    thread: ~0.4 against 1.8 ms a layer). V is met the same way, the other heads' weights zero."""
    runs = _block_runs(blocks)
    if len(runs) > MAX_RUNS:
        return None
    block_size, hkv, d = kv_cache.shape[3], kv_cache.shape[2], kv_cache.shape[4]
    last, filled = blocks[-1], seq_len - (len(blocks) - 1) * block_size
    dtype = _matmul_dtype(kv_cache, q)
    qt = q.to(dtype).T                                                     # [D, Hq]
    parts = []
    for first, count in runs:
        k = kv_cache[0, first:first + count].reshape(-1, d).to(dtype)      # [c*Hkv*BS, D]
        every = (k @ qt).float().view(count, hkv, block_size, hkv, group)
        own = torch.diagonal(every, dim1=1, dim2=3).permute(3, 2, 0, 1)    # [Hkv, G, c, BS]
        if first <= last < first + count and filled < block_size:
            own = own.clone()
            own[:, :, last - first, filled:] = float("-inf")
        parts.append(own.reshape(hkv, group, count * block_size))
    scores = torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]      # [Hkv, G, L]
    probs = torch.softmax(scores.mul_(scale), dim=-1).to(dtype)
    out = None
    offset = 0
    for first, count in runs:
        own = probs[:, :, offset:offset + count * block_size].view(hkv, group, count, block_size)
        weights = q.new_zeros((hkv, group, count, hkv, block_size), dtype=dtype)
        torch.diagonal(weights, dim1=0, dim2=3).copy_(own.permute(1, 2, 3, 0))
        v = kv_cache[1, first:first + count].reshape(-1, d).to(dtype)      # [c*Hkv*BS, D]
        o = (weights.view(hkv * group, -1) @ v).float()                    # [Hq, D]
        out = o if out is None else out + o
        offset += count * block_size
    return out.to(q.dtype)


def _decode_gathered(q, kv_cache, block_tables, seq_lens, group, scale):
    """All decodes at once, on the cache's own block layout: each KV head's `group` query
    heads multiply its blocks ([n, blocks, Hkv, BS, D]), so K and V are neither permuted into
    one long row per sequence nor repeated per query head (as the padded SDPA did)."""
    n, max_len = q.shape[0], max(seq_lens)
    if max_len == 0:
        return torch.zeros_like(q)
    block_size, hkv, d = kv_cache.shape[3], kv_cache.shape[2], kv_cache.shape[4]
    num_blocks = (max_len + block_size - 1) // block_size
    tables = block_tables[:, :num_blocks].long().clamp(min=0)
    dtype = _matmul_dtype(kv_cache, q)
    k, v = kv_cache[0, tables].to(dtype), kv_cache[1, tables].to(dtype)   # [n, NB, Hkv, BS, D]
    # K on the left, as stored: [BS, D] @ [D, G] per block and head (2x faster on a CPU
    # than q @ K^T, which reads K transposed)
    qt = q.view(n, 1, hkv, group, d).transpose(-1, -2).contiguous().to(k.dtype)
    scores = torch.matmul(k, qt).float()                          # [n, NB, Hkv, BS, G]
    scores = scores.permute(0, 2, 4, 1, 3).reshape(n, hkv, group, num_blocks * block_size)
    lens = torch.tensor(seq_lens, device=q.device)
    pad = torch.arange(num_blocks * block_size, device=q.device)[None, :] >= lens[:, None]
    scores.mul_(scale).masked_fill_(pad[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num_()           # seq_len 0 rows: all -inf
    probs = probs.view(n, hkv, group, num_blocks, block_size).permute(0, 3, 1, 2, 4)
    o = torch.matmul(probs.to(v.dtype), v).sum(dim=1, dtype=torch.float32)  # [n, Hkv, G, D]
    return o.reshape(n, hkv * group, d).to(q.dtype)
