"""The step's token bitmask: filled on the host per constrained row, applied to the logits on
the device (outside any CUDA graph: the graph ends at the logits)."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from autoglm_serve.structured.matcher import bitmask_width


def fill_step_bitmask(requests: Sequence, vocab_size: int,
                      inflight_token: Callable[[object], int], pin: bool = False
                      ) -> torch.Tensor | None:
    """[len(requests), W] int32 on the host, bit t of a row set when token t may come next
    (-1: every token, for rows without a grammar); None when no row has one.

    A row's matcher first takes the tokens it has not seen: those landed, then the one still
    in flight from the previous step (inflight_token reads it, waiting for that step's copy).
    pin: in pinned memory, so that its copy to the device is queued, not waited for.
    """
    rows = [i for i, r in enumerate(requests) if r.grammar is not None]
    if not rows:
        return None
    mask = torch.full((len(requests), bitmask_width(vocab_size)), -1, dtype=torch.int32,
                      pin_memory=pin)
    for i in rows:
        req = requests[i]
        matcher = req.grammar
        matcher.catch_up(req.output_token_ids)
        if matcher.num_tokens < len(req.output_token_ids) + req.num_inflight:
            matcher.accept(inflight_token(req))
        matcher.fill(mask, i)
    return mask


_SHIFTS: dict[torch.device, torch.Tensor] = {}


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """logits [B, V] with every token whose bit is clear set to -inf, in place; bitmask
    [B, W] int32 on the logits' device. Tensor ops only: no host sync."""
    shifts = _SHIFTS.get(logits.device)
    if shifts is None:
        shifts = _SHIFTS[logits.device] = torch.arange(32, dtype=torch.int32,
                                                       device=logits.device)
    V = logits.shape[-1]
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).view(bitmask.shape[0], -1)[:, :V]
    return logits.masked_fill_(allowed == 0, float("-inf"))
