"""The <think>…</think> split for GLM thinking models (vLLM's `glm45` reasoning parser).

Text inside <think>…</think> is reasoning; the rest is content, with GLM-4.1V's <answer> and
</answer> tags removed. It works on deltas: a tag may arrive split across tokens, so a tail that
could begin a tag is held back until the next delta (or the end) decides it.
"""
from __future__ import annotations

THINK_START, THINK_END = "<think>", "</think>"
ANSWER_TAGS = ("<answer>", "</answer>")
REASONING_PARSERS = ("glm45", "glm4", "glm4v", "deepseek_r1")


def prompt_opens_thinking(prompt: str) -> bool:
    """A template may end the prompt inside <think> (the model then writes only the rest)."""
    return prompt.rfind(THINK_START) > prompt.rfind(THINK_END)


def _partial_tag_len(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of text that is a proper prefix of one of tags."""
    best = 0
    for tag in tags:
        for k in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:k]):
                best = k
                break
    return best


class ReasoningSplitter:
    def __init__(self, in_reasoning: bool = False):
        self.in_reasoning = in_reasoning
        self._pending = ""

    def feed(self, delta: str, final: bool = False) -> tuple[str, str]:
        """Returns (reasoning, content) that this delta completes."""
        text = self._pending + delta
        self._pending = ""
        reasoning: list[str] = []
        content: list[str] = []
        while text:
            if self.in_reasoning:
                i = text.find(THINK_END)
                if i >= 0:
                    reasoning.append(text[:i])
                    text = text[i + len(THINK_END):]
                    self.in_reasoning = False
                    continue
                keep = 0 if final else _partial_tag_len(text, (THINK_END,))
                reasoning.append(text[:len(text) - keep])
                self._pending = text[len(text) - keep:]
                break
            i = text.find(THINK_START)
            head = text if i < 0 else text[:i]
            for tag in ANSWER_TAGS:
                head = head.replace(tag, "")
            if i >= 0:
                content.append(head)
                text = text[i + len(THINK_START):]
                self.in_reasoning = True
                continue
            keep = 0 if final else _partial_tag_len(head, (THINK_START,) + ANSWER_TAGS)
            content.append(head[:len(head) - keep])
            self._pending = head[len(head) - keep:]
            break
        return "".join(reasoning), "".join(content)


def split_reasoning(text: str, in_reasoning: bool = False) -> tuple[str | None, str]:
    """Whole-text split for non-streaming responses: (reasoning or None, content)."""
    splitter = ReasoningSplitter(in_reasoning)
    reasoning, content = splitter.feed(text, final=True)
    saw_reasoning = in_reasoning or THINK_START in text
    return (reasoning if saw_reasoning else None), content
