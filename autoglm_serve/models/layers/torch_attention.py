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
        # All decodes at once: pad every context to the longest, mask the padding.
        n, max_len = q.shape[0], max(seq_lens)
        if max_len == 0:
            return torch.zeros_like(q)
        block_size = kv_cache.shape[3]
        num_blocks = (max_len + block_size - 1) // block_size
        tables = block_tables[:, :num_blocks].long().clamp(min=0)
        hkv, d = kv_cache.shape[2], kv_cache.shape[4]
        k = kv_cache[0, tables].permute(0, 2, 1, 3, 4).reshape(n, hkv, -1, d)[:, :, :max_len]
        v = kv_cache[1, tables].permute(0, 2, 1, 3, 4).reshape(n, hkv, -1, d)[:, :, :max_len]
        k, v = k.float(), v.float()
        lens = torch.tensor(seq_lens, device=q.device)
        mask = torch.arange(max_len, device=q.device)[None, :] < lens[:, None]
        qh = q.float().unsqueeze(2)  # [n, H, 1, D]
        o = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask[:, None, None, :], scale=scale,
                                           enable_gqa=group > 1)
        o = torch.nan_to_num(o)  # rows with seq_len 0 (padding)
        return o.squeeze(2).to(q.dtype)
