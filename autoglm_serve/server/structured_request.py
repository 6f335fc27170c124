"""A request's structured-output fields as one StructuredSpec, checked (a bad one is a 400).

Accepted, one per request: OpenAI's response_format (json_object, json_schema), vLLM's
structured_outputs (json, regex, choice, grammar, json_object) and its older guided_json,
guided_regex, guided_choice, guided_grammar. A `grammar` naming a built-in (autoglm_action) is
that grammar, not EBNF.
"""
from __future__ import annotations

from autoglm_serve.server.errors import bad_request
from autoglm_serve.structured.spec import BUILTIN_GRAMMARS, StructuredSpec


def _grammar(source: str, max_text_chars: int | None) -> StructuredSpec:
    if source in BUILTIN_GRAMMARS:
        return StructuredSpec(source, "", max_text_chars)
    return StructuredSpec("grammar", source)


def _requested(req) -> list[tuple[str, object]]:
    """(param, make spec) for every structured field the request sets."""
    found = []
    rf = getattr(req, "response_format", None)
    if rf is not None and rf.type == "json_object":
        found.append(("response_format", lambda: StructuredSpec("json_object")))
    elif rf is not None and rf.type == "json_schema":
        if rf.json_schema is None or rf.json_schema.schema_ is None:
            raise bad_request("response_format json_schema needs json_schema.schema",
                              "response_format.json_schema")
        found.append(("response_format.json_schema.schema",
                      lambda: StructuredSpec.json_schema(rf.json_schema.schema_)))
    so = req.structured_outputs
    if so is not None:
        if so.json_ is not None:
            found.append(("structured_outputs.json", lambda: StructuredSpec.json_schema(so.json_)))
        if so.regex is not None:
            found.append(("structured_outputs.regex", lambda: StructuredSpec("regex", so.regex)))
        if so.choice is not None:
            found.append(("structured_outputs.choice", lambda: StructuredSpec.choice(so.choice)))
        if so.grammar is not None:
            found.append(("structured_outputs.grammar",
                          lambda: _grammar(so.grammar, so.max_text_chars)))
        if so.json_object:
            found.append(("structured_outputs.json_object",
                          lambda: StructuredSpec("json_object")))
    if req.guided_json is not None:
        found.append(("guided_json", lambda: StructuredSpec.json_schema(req.guided_json)))
    if req.guided_regex is not None:
        found.append(("guided_regex", lambda: StructuredSpec("regex", req.guided_regex)))
    if req.guided_choice is not None:
        found.append(("guided_choice", lambda: StructuredSpec.choice(req.guided_choice)))
    if req.guided_grammar is not None:
        found.append(("guided_grammar", lambda: _grammar(req.guided_grammar, None)))
    return found


def checked(spec_fn, param: str) -> StructuredSpec:
    try:
        spec = spec_fn()
        spec.validate()
    except ValueError as exc:
        raise bad_request(str(exc), param) from exc
    return spec


def structured_spec(req) -> StructuredSpec | None:
    found = _requested(req)
    if len(found) > 1:
        raise bad_request("only one structured output may be asked for, got "
                          + ", ".join(p for p, _ in found), found[1][0])
    if not found:
        return None
    param, make = found[0]
    return checked(make, param)
