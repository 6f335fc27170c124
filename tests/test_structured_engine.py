"""Structured outputs in the engine itself (the offline LLM on the embedded default): grammars
compile off the engine loop, one that cannot compile fails its request alone, and constrained
rows batched with free ones keep to their grammar on the async path."""
from __future__ import annotations

import re

from autoglm_serve import SamplingParams
from autoglm_serve.structured import StructuredSpec


def test_a_grammar_that_does_not_compile_fails_its_request_alone(default_llm):
    bad = SamplingParams(max_tokens=4, structured=StructuredSpec("regex", "([a-z"))
    ok = SamplingParams(max_tokens=6, temperature=0, structured=StructuredSpec("regex", "[0-9]{3}"))
    failed, served = default_llm.generate(["a", "b"], [bad, ok])
    assert failed.error is not None and "did not compile" in failed.error.message
    assert served.error is None and re.fullmatch(r"[0-9]{3}", served.outputs[0].text)


def test_constrained_and_free_rows_in_one_batch(default_llm):
    spec = StructuredSpec("regex", "(yes|no)-[a-z]{4}")
    params = [SamplingParams(max_tokens=12, temperature=1.0, seed=i,
                             structured=spec if i % 2 else None) for i in range(8)]
    outs = default_llm.generate(["Answer:"] * 8, params)
    for out in outs[1::2]:
        assert re.fullmatch(r"(yes|no)-[a-z]{4}", out.outputs[0].text), out.outputs[0].text
        assert out.outputs[0].finish_reason == "stop"
    # the free rows were not held to it
    assert not all(re.fullmatch(r"(yes|no)-[a-z]{4}", o.outputs[0].text) for o in outs[::2])
