"""What a request constrains its output to (StructuredSpec), checked without a tokenizer.

The spec travels with SamplingParams to the engine core (maybe another process), which compiles
it once per distinct spec for its vocabulary (structured/backend.py). Checking here, in the
front-end, turns a malformed schema, regex or grammar into a 400 before anything is queued.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

Kind = Literal["json", "json_object", "regex", "choice", "grammar", "autoglm_action"]
KINDS = ("json", "json_object", "regex", "choice", "grammar", "autoglm_action")
# A `grammar` naming one of these is ours, not EBNF.
BUILTIN_GRAMMARS = ("autoglm_action",)


@dataclass(frozen=True)
class StructuredSpec:
    kind: Kind
    # json: the schema as canonical JSON text; regex / grammar: the source; choice: a JSON list
    # of strings; json_object: ""; autoglm_action: "" (its knobs below)
    value: str = ""
    # autoglm_action: longest <think> text and string argument, in characters (None: no bound)
    max_text_chars: int | None = None

    @property
    def key(self) -> tuple:
        """The grammar cache's key: equal specs compile once."""
        return (self.kind, self.value, self.max_text_chars)

    @classmethod
    def json_schema(cls, schema: dict | str | bool) -> StructuredSpec:
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise ValueError(f"the JSON schema is not valid JSON: {exc}") from None
        if not isinstance(schema, (dict, bool)):
            raise ValueError("a JSON schema must be an object")
        return cls("json", json.dumps(schema, separators=(",", ":")))

    @classmethod
    def choice(cls, options: list) -> StructuredSpec:
        if not options or not all(isinstance(o, str) for o in options):
            raise ValueError("choice must be a non-empty list of strings")
        return cls("choice", json.dumps(list(options)))

    def validate(self) -> None:
        """Raises ValueError with the grammar engine's reason when the spec cannot compile."""
        from autoglm_serve.structured.backend import grammar_of
        if self.kind not in KINDS:
            raise ValueError(f"unknown structured output kind {self.kind!r}")
        if self.max_text_chars is not None and (not isinstance(self.max_text_chars, int)
                                                or self.max_text_chars < 1):
            raise ValueError("max_text_chars must be a positive integer")
        try:
            grammar_of(self)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise ValueError(f"invalid {self.kind} for structured output: "
                             f"{_short(exc)}") from None


def _short(exc: Exception) -> str:
    """xgrammar's messages start with a C++ source location: keep the reason."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.split(": ", 1)[1] if text.startswith("[") and ": " in text else text
