"""`StructuredOutputs` -> an llguidance grammar, and the tokenizer-free check run when a request is made."""

from __future__ import annotations

import json

import llguidance
from llguidance.gbnf_to_lark import any_to_lark

from deepinfer.sampling.params import StructuredOutputs
from deepinfer.structured.dsml import JSON_STYLE, tool_call_grammar


def grammar_text(spec: StructuredOutputs, dsml_id: int | None = None) -> str:
    """The llguidance grammar of `spec`; `dsml_id` as in `dsml.tool_call_grammar`. Raises ValueError
    naming the problem for what cannot even be translated (a schema that is not JSON, a GBNF error)."""
    kind = spec.kind
    if kind == "json_object":
        return _json({"type": "object"})
    if kind == "json_schema":
        schema = spec.json_schema
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise ValueError(f"json_schema is not valid JSON: {exc}") from None
        if not isinstance(schema, dict):
            raise ValueError(f"json_schema must be a JSON object, got {type(schema).__name__}")
        return _json(schema)
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec.regex or "")
    if kind == "choice":
        return llguidance.LLMatcher.grammar_from_lark(
            "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in spec.choice or []))
    if kind == "grammar":
        try:
            lark = any_to_lark(spec.grammar or "")
        except Exception as exc:  # the GBNF converter raises bare Exceptions
            raise ValueError(f"grammar: cannot read it as Lark or GBNF: {exc}") from None
        return llguidance.LLMatcher.grammar_from_lark(lark)
    assert spec.tools is not None
    return llguidance.LLMatcher.grammar_from_lark(tool_call_grammar(spec.tools, dsml_id))


def check(spec: StructuredOutputs) -> None:
    """Raise ValueError naming the error if `spec`'s schema, regex or grammar is malformed."""
    error = llguidance.LLMatcher.validate_grammar(grammar_text(spec))
    if error:
        raise ValueError(f"invalid {spec.kind}: {_first_line(error)}")


def _json(schema: dict) -> str:
    schema = {**schema, "x-guidance": {**JSON_STYLE, **schema.get("x-guidance", {})}}
    return llguidance.LLMatcher.grammar_from_json_schema(schema)


def _first_line(error: str) -> str:
    """The message without llguidance's grammar dump, on one line."""
    return " ".join(error.split("<state>")[0].split())[:400]
