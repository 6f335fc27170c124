"""Open-AutoGLM's action language as a grammar, and its parse for the response.

AutoGLM-Phone answers `<think>...</think><answer>ACTION</answer>`; Open-AutoGLM
(phone_agent/model/client.py, phone_agent/actions/handler.py) takes ACTION from the first
`finish(message=` or `do(action=` in the content, then: a Type/Type_Name action's text is what
lies between `text="` and the final `")`, another do(...) is parsed as a Python call whose
keyword values are literals, finish's message is what lies between `finish(message="` and the
final `")`. Coordinates are relative, 0..999.

The grammar makes every answer parse under those rules: one action of the known set with its
arguments, integers without leading zeros (Python literals) in 0..999, and strings without
`"`, `\\`, `<`, `=` or control characters (a NUL is no Python source), so no string can end the literal early, hold a second
`do(action=` that the client would split at, or close a tag. The <think> text is free but for
`<` and `=` (it must not contain `</think>` or the client's markers). </answer> is one of
GLM-4.1V's EOS ids: after the action only a stop token can follow.
"""
from __future__ import annotations

import ast

# action -> its arguments after action="...": element/start/end are points, the rest strings
ACTIONS: dict[str, tuple[str, ...]] = {
    "Launch": ("app",),
    "Tap": ("element",),
    "Type": ("text",),
    "Type_Name": ("text",),
    "Swipe": ("start", "end"),
    "Long Press": ("element",),
    "Double Tap": ("element",),
    "Back": (),
    "Home": (),
    "Wait": ("duration",),
    "Take_over": ("message",),
    "Note": ("message",),
    "Call_API": ("instruction",),
    "Interact": (),
}
POINT_ARGS = ("element", "start", "end")


def _lit(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def action_ebnf(max_text_chars: int | None = None) -> str:
    """xgrammar EBNF of one AutoGLM step: free thinking, then one action."""
    rep = "*" if max_text_chars is None else f"{{0,{max_text_chars}}}"
    alternatives = []
    for name, args in ACTIONS.items():
        parts = [_lit(f'do(action="{name}"')]
        for arg in args:
            parts.append(_lit(f", {arg}="))
            parts.append("point" if arg in POINT_ARGS else "string")
        if name == "Tap":   # a sensitive tap carries a message (the user confirms it)
            parts.append(f'({_lit(", message=")} string)?')
        parts.append(_lit(")"))
        alternatives.append(" ".join(parts))
    alternatives.append(f'{_lit("finish(message=")} string {_lit(")")}')
    return "\n".join([
        f'root ::= {_lit("<think>")} think {_lit("</think><answer>")} action',
        f"think ::= [^<=]{rep}",
        "action ::= " + " | ".join(f"({a})" for a in alternatives),
        f'string ::= "\\"" [^"\\\\<=\\x00-\\x1f\\x7f]{rep} "\\""',
        'point ::= "[" coord ", " coord "]"',
        'coord ::= "0" | [1-9] [0-9]? [0-9]?',
    ])


def parse_action(content: str) -> dict | None:
    """The action of an answer as Open-AutoGLM's dict ({"_metadata": "do" | "finish", ...}),
    or None when the text holds none (the request was cut short)."""
    for marker in ("finish(message=", "do(action="):
        at = content.find(marker)
        if at >= 0:
            break
    else:
        return None
    action = content[at:].replace("</answer>", "").strip()
    try:
        call = ast.parse(action, mode="eval").body
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
            return None
        out = {"_metadata": call.func.id}
        for kw in call.keywords:
            out[kw.arg] = ast.literal_eval(kw.value)
        return out
    except (SyntaxError, ValueError):
        return None
