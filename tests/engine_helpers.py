"""Engines that share one loaded model, for tests that need other engine settings.

Loading the embedded default takes seconds; ``LLM(loaded=...)`` reuses its weights. The KV
cache tensors hang on the model's attention layers, though, so an engine must bind its own
caches before it steps and give the previous ones back after (else the other engine would
index its block ids into a cache of another size).
"""
from __future__ import annotations

from contextlib import contextmanager

from autoglm_serve import LLM


def sibling_llm(base: LLM, **settings) -> LLM:
    """A new engine over base's weights with other settings (block budget, token budget...).
    Token-id prompts only by default: loading the GGUF tokenizer again costs seconds."""
    settings.setdefault("skip_tokenizer_init", True)
    with bound(base):   # building the sibling allocates and binds its cache: restore base's
        return LLM(loaded=base.engine.core.loaded, **settings)


@contextmanager
def bound(llm: LLM):
    runner = llm.engine.core.runner
    before = [layer.kv_cache for layer in runner.attention_layers]
    for layer, cache in zip(runner.attention_layers, runner.kv_caches):
        layer.kv_cache = cache
    try:
        yield llm
    finally:
        for layer, cache in zip(runner.attention_layers, before):
            layer.kv_cache = cache


def generate(llm: LLM, prompts, params):
    with bound(llm):
        return llm.generate(prompts, params)
