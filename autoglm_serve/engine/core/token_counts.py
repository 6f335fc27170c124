"""Each penalized request's token occurrences, kept on the device and updated by the step that
samples them.

Frequency, presence and repetition penalties read every token a request has produced so far,
including the one the step before is still computing. Built from the host's lists, that token
is not known yet, so such steps used to wait for the step before them (no overlap of host and
device work: about a quarter of Open-AutoGLM's throughput). Here each such request owns a row
(a slot) of a [slots, vocab] count table on the device; the runner adds each sampled token to
its row right after sampling, in stream order, so the next step reads counts that already hold
its in-flight token without the host knowing it. Repetition penalty also needs the prompt's
tokens: a bool row per slot, written once.
"""
from __future__ import annotations

import torch

from autoglm_serve.engine.core.request import Request
from autoglm_serve.host_transfer import to_device


def token_counts(token_lists, vocab_size: int, device: torch.device | str) -> torch.Tensor:
    """[B, V] float32 occurrence counts of host token lists (ids outside the vocabulary are
    ignored: they cannot be penalized), from one flat copy and one scatter-add."""
    from array import array
    lengths = torch.tensor([len(t) for t in token_lists], dtype=torch.int64)
    # array('q', list) per row + one join is ~4x faster than torch.tensor on a flat Python list
    raw = bytearray(b"".join(array("q", t).tobytes() for t in token_lists))
    flat = torch.frombuffer(raw, dtype=torch.int64) if raw else torch.empty(0, dtype=torch.int64)
    row = torch.repeat_interleave(torch.arange(len(token_lists)), lengths)
    keep = (flat >= 0) & (flat < vocab_size)
    index = to_device(row[keep] * vocab_size + flat[keep], torch.int64, torch.device(device))
    counts = torch.zeros(len(token_lists) * vocab_size, dtype=torch.float32, device=device)
    counts.scatter_add_(0, index, torch.ones(index.shape, dtype=torch.float32, device=device))
    return counts.view(len(token_lists), vocab_size)


class DeviceTokenCounts:
    def __init__(self, vocab_size: int, device: torch.device):
        self.vocab_size = vocab_size
        self.device = device
        self.counts = torch.zeros(0, vocab_size, dtype=torch.float32, device=device)
        # bool [slots, V], grown with the counts so that the memory plan's reserve holds it;
        # its rows are written once some request asks for a repetition penalty
        self.prompt_mask = torch.zeros(0, vocab_size, dtype=torch.bool, device=device)
        self._prompts_written = False
        self._slots: dict[str, tuple[Request, int]] = {}
        self._free: list[int] = []

    @property
    def capacity(self) -> int:
        return self.counts.shape[0]

    def reserve(self, slots: int) -> None:
        """Grows the tables to at least this many slots (the start-up profile reserves
        max_num_seqs, so the KV cache is sized with both tables in place)."""
        if slots <= self.capacity:
            return
        counts = torch.zeros(slots, self.vocab_size, dtype=torch.float32, device=self.device)
        mask = torch.zeros(slots, self.vocab_size, dtype=torch.bool, device=self.device)
        counts[:self.capacity] = self.counts
        mask[:self.capacity] = self.prompt_mask
        self._free += range(self.capacity, slots)
        self.counts, self.prompt_mask = counts, mask

    def _slot(self, req: Request) -> int:
        held = self._slots.get(req.request_id)
        if held is not None and held[0] is req:
            return held[1]
        if not self._free:
            self._release_finished()
        if not self._free:
            self.reserve(max(16, 2 * self.capacity))
        slot = self._free.pop()
        self._slots[req.request_id] = (req, slot)
        # A new slot starts from what the host knows; nothing of this request is in flight
        # yet: a penalized request samples through its slot from its first token on.
        self.counts[slot] = token_counts([req.output_token_ids], self.vocab_size, self.device)[0]
        if self._prompts_written:
            self._write_prompt(req, slot)
        return slot

    def _write_prompt(self, req: Request, slot: int) -> None:
        self.prompt_mask[slot] = token_counts([req.prompt_token_ids], self.vocab_size,
                                              self.device)[0] > 0

    def _release_finished(self) -> None:
        # Device work queued for a released slot (a discarded last token's count) runs before
        # any later reuse zeroes it: one stream, launch order.
        for rid, (req, slot) in list(self._slots.items()):
            if req.status.finished:
                del self._slots[rid]
                self._free.append(slot)

    def gather(self, requests: list[Request], rows: list[bool], repetition: bool
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(slots [B] int64 on the device, counts [B, V], prompt mask [B, V] or None) for the
        step's sampling rows; rows that use no penalty read a zero row (slot 0's counts are
        masked off by their zero penalties in the sampler, so any slot serves)."""
        if repetition and not self._prompts_written:
            self._prompts_written = True
            for req, slot in self._slots.values():
                self._write_prompt(req, slot)
        slots = [self._slot(r) if used else -1 for r, used in zip(requests, rows)]
        index = to_device(slots, torch.int64, self.device)
        safe, unused = index.clamp(min=0), (index < 0)[:, None]
        counts = self.counts.index_select(0, safe).masked_fill_(unused, 0.0)
        mask = None
        if repetition:
            mask = self.prompt_mask.index_select(0, safe).masked_fill_(unused, False)
        return index, counts, mask

    def record(self, slots: torch.Tensor, tokens: torch.Tensor) -> None:
        """Counts each penalized row's sampled token (rows with slot -1 are skipped), on the
        device, without a host sync."""
        valid = slots >= 0
        flat = torch.where(valid, slots * self.vocab_size + tokens, 0)
        self.counts.view(-1).index_add_(0, flat, valid.to(torch.float32))
