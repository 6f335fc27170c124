"""A request's grammar state: the tokens it has accepted, and its next-token bitmask."""
from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)


def bitmask_width(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


class RowMatcher:
    """Advances with the request's output tokens, counted, so that a caller may catch it up
    from any point (a token landed from the device, or read ahead from the step in flight)."""

    def __init__(self, matcher):
        self._m = matcher
        self.num_tokens = 0         # output tokens accepted so far
        self.failed = False         # it rejected a token: the row runs unconstrained from then

    def accept(self, token: int) -> None:
        self.num_tokens += 1
        if self.failed or self._m.is_terminated():
            return
        if not self._m.accept_token(token):
            # only a token sampled without this row's mask can do this
            logger.error("the grammar rejected token %d; the request continues unconstrained",
                         token)
            self.failed = True

    def catch_up(self, output_token_ids) -> None:
        for token in output_token_ids[self.num_tokens:]:
            self.accept(token)

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """bitmask[row] = the tokens allowed next (all, once it terminated or failed)."""
        if self.failed or self._m.is_terminated():
            bitmask[row].fill_(-1)
            return
        self._m.fill_next_token_bitmask(bitmask, row)
        if not bitmask[row].any():
            # complete, and the request has no stop token to end it (ignore_eos): the
            # grammar has nothing more to say, rather than a row of -inf logits
            bitmask[row].fill_(-1)
