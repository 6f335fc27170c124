"""The front-end's output side: the token that ends a request stays out of its text."""
from __future__ import annotations

import pytest

from autoglm_serve.engine.core.engine_core import CoreOutput
from autoglm_serve.engine.frontend.output_processor import OutputProcessor
from autoglm_serve.engine.core.request import Request
from autoglm_serve.models.configs.glm_tokenizer import byte_level_glm_tokenizer
from autoglm_serve.sampling_params import SamplingParams

ACTION = 'do(action="Type", text="hello")'


@pytest.mark.parametrize("include_stop", [False, True])
def test_answer_eos_is_left_out_of_the_text(include_stop):
    """GLM-4.1V's </answer> (151348) is an EOS id and an ordinary token: as in vLLM, a request
    it stops reads up to the action's ")" (Open-AutoGLM slices Type actions assuming so), and
    include_stop_str_in_output brings it back."""
    tokenizer = byte_level_glm_tokenizer()
    body = tokenizer("<answer>" + ACTION, add_special_tokens=False)["input_ids"]
    eos = tokenizer.convert_tokens_to_ids("</answer>")
    params = SamplingParams(max_tokens=100, include_stop_str_in_output=include_stop)
    processor = OutputProcessor(tokenizer)
    req = Request("r", [1, 2, 3], params, frozenset({eos}), max_tokens=100)
    processor.add("r", None, [req])
    processor.process([CoreOutput("r", body[:-1], None, None)])
    (out,), _ = processor.process([CoreOutput("r", [body[-1], eos], None, "stop", eos)])
    (child,) = out.outputs
    assert child.finish_reason == "stop" and child.token_ids[-1] == eos
    assert child.text == "<answer>" + ACTION + ("</answer>" if include_stop else "")


@pytest.mark.parametrize("tags_special", [False, True])
def test_reasoning_split_sees_the_tags_special_or_not(tags_special):
    """A checkpoint's tokenizer may mark <think>/<answer> special: with skip_special_tokens (the
    default) the text still carries them, so the reasoning split works; other special tokens
    are still skipped."""
    from autoglm_serve.models.configs.glm_tokenizer import TAG_OFFSETS
    from autoglm_serve.server.reasoning import split_reasoning

    tokenizer = byte_level_glm_tokenizer()
    if tags_special:
        tokenizer.add_special_tokens({"extra_special_tokens": [
            *tokenizer.extra_special_tokens, *TAG_OFFSETS]})
        assert "<think>" in tokenizer.all_special_tokens
    ids = tokenizer("<think>plan</think><answer>" + ACTION + "</answer><|user|>",
                    add_special_tokens=False)["input_ids"]
    processor = OutputProcessor(tokenizer, keep_special_tokens=TAG_OFFSETS)
    req = Request("r", [1], SamplingParams(max_tokens=100), frozenset(), max_tokens=100)
    processor.add("r", None, [req])
    (out,), _ = processor.process([CoreOutput("r", ids, None, "length")])
    text = out.outputs[0].text
    assert text == "<think>plan</think><answer>" + ACTION + "</answer>"
    assert split_reasoning(text) == ("plan", ACTION)
