"""Long prefill chunks through SDPA on K/V gathered from the paged cache (the Triton backend's
alternative to its paged prefill kernel).

A phone agent's step is a screenshot's ~3,100 image tokens plus its text after thousands of
cached tokens of history. The paged kernel reads the cache through the block table per token
and runs those chunks at ~210-330 TFLOP/s on an H200; cuDNN's attention runs the same maths at
~600 over contiguous K/V, and one layer's K/V is small (GLM-4: 2 KV heads, 1 KB a token), so
gathering it costs little. cuDNN's causal mask is aligned at the top left, which is right for a
prompt from its first token but not for a chunk after cached context; such a chunk is attended
in two parts, each query over the whole context (no mask) and over the chunk (causal), merged
by their log-sum-exps.
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from autoglm_serve.models.layers.attention import AttentionMetadata
from autoglm_serve.models.layers.torch_attention import gather_kv

logger = logging.getLogger(__name__)

# Prefill steps whose prefills are at most this many sequences, each chunk at least this long,
# take this path (shorter chunks stay with the paged kernel: see scripts/gpu/
# prefill_context_bench.py for where the two cross).
DENSE_PREFILL_MAX_SEQS = 4
DENSE_PREFILL_MIN_TOKENS = 1024

# Whether cuDNN's attention took fewer KV heads than query heads (GQA) in this process; None:
# not tried yet. Without it the chunk's few KV heads are repeated per query head.
_cudnn_takes_gqa: bool | None = None


def dense_prefills(meta: AttentionMetadata) -> list[tuple[int, int, int]] | None:
    """(sequence, first row, end row) of every prefill of the step when all of them qualify:
    few, and each chunk long."""
    first = meta.num_decodes
    if (meta.num_seqs - first > DENSE_PREFILL_MAX_SEQS
            or meta.max_query_len < DENSE_PREFILL_MIN_TOKENS):
        return None
    starts = meta.query_start_loc_cpu.tolist()
    rows = []
    for seq in range(first, meta.num_seqs):
        start, end = starts[seq], starts[seq + 1]
        if end - start < DENSE_PREFILL_MIN_TOKENS:
            return None
        rows.append((seq, start, end))
    return rows


def attend_dense(out: torch.Tensor, q: torch.Tensor, kv_cache: torch.Tensor,
                 meta: AttentionMetadata, rows: list[tuple[int, int, int]],
                 scale: float) -> None:
    """Causal attention of each listed chunk over its sequence's whole context, K/V (this
    step's included) read from the cache; out, q: [T, H, D]."""
    seq_lens = meta.seq_lens_cpu.tolist()
    for seq, start, end in rows:
        seq_len = seq_lens[seq]
        keys, values = gather_kv(kv_cache, meta.block_tables[seq], seq_len)
        out[start:end] = chunk_attention(q[start:end], keys.to(q.dtype), values.to(q.dtype),
                                         seq_len - (end - start), scale)


def chunk_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, context: int,
                    scale: float) -> torch.Tensor:
    """Queries q [L, H, D] at positions context .. context + L - 1 over keys/values
    [context + L, Hkv, D]; [L, H, D] in q's dtype."""
    qh, kh, vh = (t.transpose(0, 1).unsqueeze(0) for t in (q, keys, values))
    if context == 0:
        o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale,
                                           enable_gqa=kh.shape[1] != qh.shape[1])
        return o[0].transpose(0, 1)
    past, past_lse = _attention_with_lse(qh, kh[:, :, :context], vh[:, :, :context], scale,
                                         causal=False)
    own, own_lse = _attention_with_lse(qh, kh[:, :, context:], vh[:, :, context:], scale,
                                       causal=True)
    # softmax over both key sets = each part's output weighted by its share of the mass
    share = torch.sigmoid(own_lse - past_lse).unsqueeze(-1)
    o = torch.lerp(past.float(), own.float(), share)
    return o[0].transpose(0, 1).to(q.dtype)


def _attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                        causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [1, H, L, D], natural log-sum-exp [1, H, L] float32) of q [1, H, L, D] over k, v
    [1, Hkv, S, D]: cuDNN's kernel on a GPU, the flash kernel on a CPU (both take GQA)."""
    if q.device.type != "cuda":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, is_causal=causal, scale=scale)[:2]
        return out, lse.reshape(q.shape[:3]).float()
    global _cudnn_takes_gqa
    group = q.shape[1] // k.shape[1]
    if group > 1 and _cudnn_takes_gqa is not False:
        try:
            out, lse = _cudnn(q, k, v, scale, causal)
            _cudnn_takes_gqa = True
            return out, lse
        except RuntimeError as exc:
            if _cudnn_takes_gqa:
                raise
            _cudnn_takes_gqa = False
            logger.info("cuDNN attention does not take GQA here (%s): repeating KV heads", exc)
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return _cudnn(q, k, v, scale, causal)


def _cudnn(q, k, v, scale: float, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, 0.0, causal, False, scale=scale)[:2]
    return out, lse.reshape(q.shape[:3]).float()
