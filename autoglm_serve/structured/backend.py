"""The grammar engine behind structured outputs: xgrammar.

Measured against llguidance on the per-step host cost that matters here, the bitmask of every
constrained row (scripts/structured_backend_bench.py, SmolLM2's 49k vocabulary, a nested JSON
schema, 1 CPU thread): xgrammar 2.8 us per row at 32 rows (5.9 us alone), llguidance 12.3 us
(41 us alone). So xgrammar is the backend; `GrammarBackend` is the seam for another.

Grammars are compiled once per distinct spec (an LRU keyed by StructuredSpec.key) for the
engine's vocabulary; each request then gets its own cheap matcher over the shared compiled
grammar.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Protocol

import xgrammar as xgr

from autoglm_serve.structured.action_grammar import action_ebnf
from autoglm_serve.structured.matcher import RowMatcher
from autoglm_serve.structured.spec import StructuredSpec

CACHE_SIZE = 256    # distinct grammars kept compiled


class GrammarBackend(Protocol):
    def matcher(self, spec: StructuredSpec, stop_token_ids: Iterable[int]) -> RowMatcher: ...


def _ebnf_literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)   # EBNF string literals escape as JSON does


def grammar_of(spec: StructuredSpec) -> xgr.Grammar:
    """The spec as an xgrammar Grammar; needs no tokenizer (the front-end checks with it)."""
    if spec.kind == "json":
        # compact separators: a model, random or not, cannot pad the output with whitespace
        # forever; strict: no properties beyond the schema's
        return xgr.Grammar.from_json_schema(spec.value, any_whitespace=False, strict_mode=True)
    if spec.kind == "json_object":
        return xgr.Grammar.builtin_json_grammar()
    if spec.kind == "regex":
        return xgr.Grammar.from_regex(spec.value)
    if spec.kind == "choice":
        options = json.loads(spec.value)
        return xgr.Grammar.from_ebnf("root ::= " + " | ".join(map(_ebnf_literal, options)))
    if spec.kind == "grammar":
        return xgr.Grammar.from_ebnf(spec.value)
    if spec.kind == "autoglm_action":
        return xgr.Grammar.from_ebnf(action_ebnf(spec.max_text_chars))
    raise ValueError(f"unknown structured output kind {spec.kind!r}")


class XGrammarBackend:
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: Iterable[int]):
        """vocab_size: the logits' width (the model's vocabulary, maybe past the tokenizer's)."""
        base = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        # Special tokens can never be text: from_huggingface leaves some tokenizers' control
        # tokens matchable by their spelling ("<|user|>" inside a JSON string, which is an EOS
        # of GLM). An empty entry is what xgrammar treats as special.
        special = set(getattr(tokenizer, "all_special_ids", ()))
        vocab = [b"" if i in special else tok for i, tok in enumerate(base.decoded_vocab)]
        self.info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=vocab_size,
                                      stop_token_ids=sorted(set(stop_token_ids)))
        self.vocab_size = vocab_size
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        self._cache: OrderedDict[tuple, xgr.CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, spec: StructuredSpec) -> xgr.CompiledGrammar:
        with self._lock:
            hit = self._cache.get(spec.key)
            if hit is not None:
                self._cache.move_to_end(spec.key)
                return hit
        compiled = self.compiler.compile_grammar(grammar_of(spec))
        with self._lock:
            self._cache[spec.key] = compiled
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def is_cached(self, spec: StructuredSpec) -> bool:
        with self._lock:
            return spec.key in self._cache

    def matcher(self, spec: StructuredSpec, stop_token_ids: Iterable[int]) -> RowMatcher:
        """stop_token_ids: the request's own (EOS unless ignore_eos, its stop_token_ids):
        the tokens that may end it once the grammar is complete."""
        stops = sorted(stop_token_ids)
        # no stop token (ignore_eos): the grammar ends by itself, then the row runs free
        return RowMatcher(xgr.GrammarMatcher(self.compile(spec),
                                             override_stop_tokens=stops or None,
                                             terminate_without_stop_token=not stops))
