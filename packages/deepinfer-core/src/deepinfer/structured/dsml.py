"""Tool calls as a grammar: DeepSeek's DSML block (deepseek-recipe spec §6.3) with arguments valid under
each tool's JSON Schema, written in llguidance's Lark dialect.

A block is `"\\n\\n" open "\\n" invoke+ close`; an invoke is `<DSML invoke name="N">\\n` then one
`<DSML parameter name="K" string="true|false">V</DSML parameter>\\n` per argument, then
`</DSML invoke>\\n`. Plain-string arguments (`{"type": "string"}`, or a string enum) are raw text
(`string="true"`), everything else is JSON under the property's schema (`string="false"`). Arguments
follow the schema's property order; required ones are always present, others optional; no others.
Raw text may not contain `</` followed by the DSML marker (it would end the value early); its
minLength/maxLength bound the characters.

`｜DSML｜` is one token in DeepSeek's tokenizers. Where the tokenizer marks it special, llguidance
matches it only by id (`<[id]>`), never inside text; otherwise it is text like any other.
`mode="auto"` allows free text that never contains the DSML marker, optionally ending in a block.
"""

from __future__ import annotations

import json
from typing import Any

from deepinfer.sampling.params import ToolCallConstraint

DSML = "｜DSML｜"
_TAGS = {"v4": ("tool_calls", "invoke", "parameter"), "v4.1": (" calls", " invoke", " parameter")}
# JSON as the recipe renders non-string arguments (json.dumps separators), no free whitespace
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def tool_call_grammar(c: ToolCallConstraint, dsml_id: int | None) -> str:
    """The Lark grammar of `c`; `dsml_id`: the marker's token id when the tokenizer marks it special."""
    calls, invoke, param = _TAGS[c.dsml]
    g = _Writer(dsml_id)
    rules = [f"block: invoke+ {g.lit('</', DSML, calls, '>')}"]
    rules.append("invoke: " + " | ".join(f"invoke_{i}" for i in range(len(c.tools))))
    for i, tool in enumerate(c.tools):
        rules += _invoke_rules(g, i, tool.name, tool.parameters, invoke, param, c.dsml)
    opener = g.lit("\n\n<", DSML, calls, ">\n")
    if c.mode == "required":
        start = "start: block" if c.opened else f"start: {opener} block"
    else:  # free text without the marker, or such text then a block
        rules.append(f"FREE: /(?s:.*)/ & ~/(?s:.*){DSML}(?s:.*)/")
        if dsml_id is None:  # the marker is text: the text and the opening tag are one lexeme
            start = "start: FREE | HEAD block"
            rules.append(f"HEAD: FREE {_quote(chr(10) * 2 + '<' + DSML + calls + '>' + chr(10))}")
        else:  # the marker is a special token: text ending in a blank line and "<", then the marker
            start = f"start: FREE | FREE_LT {g.lit(DSML, calls, '>', chr(10))} block"
            rules.append('FREE_LT: FREE "\\n\\n<"')
    return "\n".join([start, *rules, *g.extra])


def _invoke_rules(g: _Writer, i: int, name: str, schema: dict[str, Any], invoke: str, param: str,
                  dsml: str) -> list[str]:
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    items = []
    for k, (key, sub) in enumerate(props.items()):
        rule = f"arg_{i}_{k}"
        items.append(rule if key in required else f"{rule}?")
        g.extra.append(f"{rule}: {_argument(g, key, sub, param)}")
    head = g.lit("<", DSML, f'{invoke} name="{name}">\n')
    tail = g.lit("</", DSML, f"{invoke}>\n")
    body = " ".join(items)
    if dsml == "v4.1" and not required:  # an invoke without arguments has an empty line in V4.1
        body = f'({body} | "\\n")' if items else '"\\n"'
    return [f"invoke_{i}: {head} {body} {tail}"]


def _argument(g: _Writer, key: str, schema: Any, param: str) -> str:
    close = g.lit("</", DSML, f"{param}>\n")
    if _raw_string(schema):
        head = g.lit("<", DSML, f'{param} name="{key}" string="true">')
        if "enum" in schema:
            return f"{head} ({' | '.join(_quote(v) for v in schema['enum'])}) {close}"
        bounds = f"{{{schema.get('minLength', 0)},{schema.get('maxLength', '')}}}"
        value = "(?s:.*)" if bounds == "{0,}" else f"(?s:.{bounds})"
        name = f"{{}}_{schema.get('minLength', 0)}_{schema.get('maxLength', 'inf')}"
        if g.dsml_id is None:  # one lazy lexeme: the value ends at the first "</" + marker
            rule = name.format("raw")
            g.define(f"{rule}[lazy]: /{value}/ {_quote('</' + DSML + param + '>' + chr(10))}")
            return f"{head} {rule}"
        rule = name.format("RAW").upper()  # the special marker cannot occur in the text
        g.define(f"{rule}: /{value}<\\//")
        return f"{head} {rule} {g.lit(DSML, param + '>' + chr(10))}"
    head = g.lit("<", DSML, f'{param} name="{key}" string="false">')
    sub = dict(schema) if isinstance(schema, dict) else {}
    sub["x-guidance"] = JSON_STYLE
    return f"{head} %json {json.dumps(sub, ensure_ascii=False)} {close}"


def _raw_string(schema: Any) -> bool:
    """A plain string, maybe length-bounded, or a string enum: the recipe's `string="true"` raw text."""
    if not isinstance(schema, dict) or schema.get("type") != "string":
        return False
    constraints = set(schema) - {"type", "description", "title", "enum", "minLength", "maxLength"}
    return not constraints and all(isinstance(v, str) for v in schema.get("enum", []))


class _Writer:
    """Literals with the DSML marker spelled as text, or as its token where it is special."""

    def __init__(self, dsml_id: int | None):
        self.dsml_id = dsml_id
        self.extra: list[str] = []

    def lit(self, *parts: str) -> str:
        if self.dsml_id is None:
            return _quote("".join(parts))
        out = [f"<[{self.dsml_id}]>" if p == DSML else _quote(p) for p in parts if p]
        return " ".join(out)

    def define(self, rule: str) -> None:
        """A shared rule, written once."""
        if rule not in self.extra:
            self.extra.append(rule)


def _quote(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)
