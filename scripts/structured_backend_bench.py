"""Per-step host cost of a JSON-schema token bitmask, xgrammar vs llguidance (CPU, no model).

For each backend: compile a schema, then for B rows walk a valid JSON document token by token
(the tokens a model would sample), filling every row's bitmask each step. Prints ms per step
(all rows) and us per row. Run: python scripts/structured_backend_bench.py [tokenizer-path]
"""
from __future__ import annotations

import json
import sys
import time

import torch

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "bb", "ccc"]}},
    "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                 "zip": {"type": "string"}},
                "required": ["city", "zip"]}},
    "required": ["name", "age", "tags", "address"], "additionalProperties": False}
DOC = {"name": "Ada Lovelace of London", "age": 36, "tags": ["a", "bb", "ccc", "a"],
       "address": {"city": "London", "zip": "W1 1AA"}}


def tokenizer():
    from autoglm_serve.tokenizer import load_tokenizer
    from autoglm_serve.loader.model_path import default_model_path
    return load_tokenizer(sys.argv[1] if len(sys.argv) > 1 else default_model_path())


def bench_xgrammar(tok, ids, rows):
    import xgrammar as xgr
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
    t0 = time.perf_counter()
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA))
    compile_s = time.perf_counter() - t0
    matchers = [xgr.GrammarMatcher(compiled) for _ in range(rows)]
    mask = xgr.allocate_token_bitmask(rows, info.vocab_size)
    t0 = time.perf_counter()
    for t in ids:
        for i, m in enumerate(matchers):
            m.fill_next_token_bitmask(mask, i)
            assert m.accept_token(t)
    return compile_s, (time.perf_counter() - t0) / len(ids)


def bench_llguidance(tok, ids, rows):
    import llguidance
    import llguidance.hf
    import llguidance.torch
    lltok = llguidance.hf.from_tokenizer(tok, n_vocab=len(tok))
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    t0 = time.perf_counter()
    matchers = [llguidance.LLMatcher(lltok, grammar) for _ in range(rows)]
    compile_s = time.perf_counter() - t0
    mask = llguidance.torch.allocate_token_bitmask(rows, lltok.vocab_size)
    t0 = time.perf_counter()
    for t in ids:
        for i, m in enumerate(matchers):
            llguidance.torch.fill_next_token_bitmask(m, mask, i)
            assert m.consume_token(t), m.get_error()
    return compile_s, (time.perf_counter() - t0) / len(ids)


def main():
    torch.set_num_threads(1)
    tok = tokenizer()
    ids = tok.encode(json.dumps(DOC), add_special_tokens=False)
    print(f"vocab {len(tok)}, document {len(ids)} tokens")
    for rows in (1, 32):
        for name, fn in (("xgrammar", bench_xgrammar), ("llguidance", bench_llguidance)):
            compile_s, step_s = fn(tok, ids, rows)
            print(f"{name:10s} rows={rows:3d} compile/first-matchers {compile_s * 1e3:7.1f} ms  "
                  f"step {step_s * 1e3:7.3f} ms  per row {step_s / rows * 1e6:7.1f} us")


if __name__ == "__main__":
    main()
