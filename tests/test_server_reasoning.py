"""The <think>…</think> split, fed whole and in every possible pair of deltas."""
from __future__ import annotations

import pytest

from autoglm_serve.server.reasoning import ReasoningSplitter, prompt_opens_thinking, split_reasoning

CASES = [
    # (generated text, prompt opened <think>, reasoning, content)
    ("<think>plan the tap</think><answer>do(action=\"Tap\", element=[1,2])</answer>", False,
     "plan the tap", 'do(action="Tap", element=[1,2])'),
    ("用户想打开设置</think>\n<answer>finish(message=\"好的 👍\")</answer>", True,
     "用户想打开设置", '\nfinish(message="好的 👍")'),
    ("no tags at all < > </", False, None, "no tags at all < > </"),
    ("still thinking, cut off by max_tokens", True, "still thinking, cut off by max_tokens", ""),
    ("<think></think>plain", False, "", "plain"),
]


@pytest.mark.parametrize("text,opened,reasoning,content", CASES)
def test_whole_text(text, opened, reasoning, content):
    assert split_reasoning(text, opened) == (reasoning, content)


@pytest.mark.parametrize("text,opened,reasoning,content", CASES)
def test_every_two_and_three_way_split_gives_the_same_result(text, opened, reasoning, content):
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1, 3):
            s = ReasoningSplitter(opened)
            parts = [s.feed(text[:i]), s.feed(text[i:j]), s.feed(text[j:], final=True)]
            assert "".join(p[0] for p in parts) == (reasoning or "")
            assert "".join(p[1] for p in parts) == content


def test_tags_are_never_emitted_partially():
    s = ReasoningSplitter()
    outs = [s.feed(ch) for ch in "<think>ab</think><answer>cd</answer>"] + [s.feed("", True)]
    emitted = "".join(r + c for r, c in outs)
    assert "<" not in emitted and emitted == "abcd"


def test_prompt_opens_thinking():
    assert prompt_opens_thinking("<|assistant|>\n<think>")
    assert not prompt_opens_thinking("<|assistant|>\n<think></think>")
    assert not prompt_opens_thinking("<|assistant|>\n")
