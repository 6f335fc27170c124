"""Token embedding and LM head, sharded over the vocabulary under tensor parallelism."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from autoglm_serve.models.layers.linear import dense_linear
from autoglm_serve.models.layers.parallel_state import tp_rank, tp_world_size


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype | None = None):
        super().__init__()
        self.tp_size = tp_world_size()
        self.vocab_size = vocab_size
        self.shard_size = (vocab_size + self.tp_size - 1) // self.tp_size
        self.start = tp_rank() * self.shard_size
        self.weight = nn.Parameter(torch.empty(self.shard_size, hidden_size, dtype=dtype),
                                   requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        shard = loaded[self.start:self.start + self.shard_size]
        param.data.zero_()
        param.data[:shard.shape[0]].copy_(shard)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.start
        mask = (local >= 0) & (local < self.shard_size)
        out = F.embedding(local.clamp(0, self.shard_size - 1), self.weight) * mask[:, None]
        torch.distributed.all_reduce(out)
        return out


class ParallelLMHead(VocabParallelEmbedding):
    # hidden -> logits from the weight in a CPU kernel's own form, set on float32 CPU models
    # (models/layers/cpu_gguf_linear.py, cpu_onednn_linear.py); the dense weight stays for the
    # embedding a tied head shares
    cpu_logits: Callable[[torch.Tensor], torch.Tensor] | None = None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.cpu_logits is not None:
            logits = self.cpu_logits(hidden)
        else:
            logits = dense_linear(hidden, self.weight)
        if self.tp_size > 1:
            parts = [torch.empty_like(logits) for _ in range(self.tp_size)]
            torch.distributed.all_gather(parts, logits)
            logits = torch.cat(parts, dim=-1)
        return logits[..., :self.vocab_size]
