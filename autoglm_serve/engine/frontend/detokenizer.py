"""Incremental detokenization and stop strings.

Tokens are decoded in a sliding window so a multi-byte character split across tokens (Chinese,
emoji) is only emitted once complete; text that could be the start of a stop string is held back
so a stop string is never shown, even when it arrives split across tokens.
"""
from __future__ import annotations

import functools

from transformers import PreTrainedTokenizerBase

_INCOMPLETE = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt_token_ids: list[int],
                 skip_special_tokens: bool = True, stop: list[str] = (),
                 include_stop_str_in_output: bool = False,
                 keep_special_ids: frozenset[int] = frozenset()):
        """keep_special_ids: special tokens decoded even when skip_special_tokens (the reasoning
        tags of a tokenizer that marks them special)."""
        # The Rust tokenizer itself when that is all tokenizer.decode would run (no clean-up
        # pass): its Python layers cost more than the decode, twice per token of every stream.
        backend = getattr(tokenizer, "backend_tokenizer", None)
        decoder = backend if backend is not None and not getattr(
            tokenizer, "clean_up_tokenization_spaces", True) else tokenizer
        self._decode = functools.partial(decoder.decode, skip_special_tokens=skip_special_tokens)
        if skip_special_tokens and keep_special_ids:
            drop = frozenset(tokenizer.all_special_ids) - keep_special_ids
            self._decode = lambda ids: decoder.decode([t for t in ids if t not in drop],
                                                      skip_special_tokens=False)
        self.stop = list(stop)
        self._longest_stop = max(map(len, self.stop), default=0)
        self.include_stop = include_stop_str_in_output
        self.tokens: list[int] = list(prompt_token_ids[-6:])  # context for leading spaces
        self.prefix_offset = 0
        self.read_offset = len(self.tokens)
        self._prefix: str | None = None   # decoded tokens[prefix_offset:read_offset], if known
        self.text = ""            # all text decoded so far (stop string cut when found)
        self.emitted = 0          # characters of text already handed out
        self.stop_reason: str | None = None

    def add_tokens(self, token_ids: list[int]) -> None:
        tokens = self.tokens
        for tid in token_ids:
            if self.stop_reason is not None:
                return
            tokens.append(tid)
            prefix = self._prefix
            if prefix is None:    # kept while the window waits for a character to complete
                prefix = self._prefix = self._decode(tokens[self.prefix_offset:self.read_offset])
            full = self._decode(tokens[self.prefix_offset:])
            if len(full) > len(prefix) and not full.endswith(_INCOMPLETE):
                self.prefix_offset = self.read_offset
                self.read_offset = len(tokens)
                self._prefix = None
                self._append(full[len(prefix):])

    def _append(self, new: str) -> None:
        if not self.stop:
            self.text += new
            return
        start = max(0, len(self.text) - self._longest_stop)
        self.text += new
        for s in self.stop:
            i = self.text.find(s, start)
            if i >= 0 and (self.stop_reason is None or i < self._stop_at):
                self.stop_reason, self._stop_at = s, i
        if self.stop_reason is not None:
            end = self._stop_at + (len(self.stop_reason) if self.include_stop else 0)
            self.text = self.text[:end]

    def new_text(self, finished: bool) -> str:
        """Text not handed out yet; a tail that may begin a stop string waits unless finished."""
        end = len(self.text)
        if self.stop and not finished and self.stop_reason is None:
            end -= self._held_back()
        out = self.text[self.emitted:end]
        self.emitted = max(self.emitted, end)
        return out

    def _held_back(self) -> int:
        held = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text)), held, -1):
                if self.text.endswith(s[:k]):
                    held = k
                    break
        return held
