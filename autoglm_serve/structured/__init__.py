"""Structured outputs: a request's spec (spec.py), compiled once per spec by the grammar
backend (backend.py), a matcher per request (matcher.py), and the bitmask the sampler applies
to its logits (bitmask.py). Open-AutoGLM's action grammar: action_grammar.py."""
from autoglm_serve.structured.spec import StructuredSpec

__all__ = ["StructuredSpec"]
