"""Engines that share one loaded model, for tests that need other engine settings.

Loading the embedded default takes seconds; ``LLM(loaded=...)`` reuses its weights. Each engine
keeps its own KV cache (its runner binds it to the shared layers at every step).
"""
from __future__ import annotations

from autoglm_serve import LLM


def sibling_llm(base: LLM, **settings) -> LLM:
    """A new engine over base's weights with other settings (block budget, token budget...).
    Token-id prompts only by default: loading the GGUF tokenizer again costs seconds."""
    settings.setdefault("skip_tokenizer_init", True)
    return LLM(loaded=base.engine.core.loaded, **settings)
