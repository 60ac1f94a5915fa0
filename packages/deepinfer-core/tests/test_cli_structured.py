"""`deepinfer generate` with a structured-output constraint, in process on the tiny random checkpoint:
the constraint reaches every completion, and mistakes in its options are one-line usage errors."""

from __future__ import annotations

import json
import re

import pytest

from deepinfer.entrypoints.cli.main import main

BASE = ["--log-level", "WARNING", "generate", "--max-model-len", "128", "--cache-mb", "16",
        "--max-tokens", "24", "--prompt-ids", "0,5,17,33", "--prompt-ids", "0,9", "--n", "2", "--json"]


def _texts(capsys) -> list[str]:
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    return [c["text"] for r in lines for c in r["outputs"]]


@pytest.mark.parametrize("constraint,valid", [
    (["--regex", "[a-z]{3}-[0-9]{2}"], lambda t: re.fullmatch("[a-z]{3}-[0-9]{2}", t)),
    (["--choice", "yes", "--choice", "no"], lambda t: t in ("yes", "no")),
], ids=["regex", "choice"])
def test_generate_follows_the_constraint(tiny_checkpoint, capsys, constraint, valid):
    assert main([*BASE, "--model", tiny_checkpoint, *constraint]) == 0
    texts = _texts(capsys)
    assert len(texts) == 4 and all(valid(t) for t in texts), texts


def test_options_make_the_constraint(tmp_path):
    """Schema and grammar from a file or inline; start_after joins whichever kind is given."""
    from deepinfer.entrypoints.cli.generate import structured_from_args
    from deepinfer.entrypoints.cli.main import build_parser

    schema, grammar = tmp_path / "schema.json", tmp_path / "g.lark"
    schema.write_text('{"enum": ["red", "green"]}')
    grammar.write_text('start: "x"+')

    def parse(*options: str):
        return structured_from_args(build_parser().parse_args(["generate", "--prompt", "p", *options]))

    assert parse() is None
    assert parse("--json-schema", str(schema), "--structured-start-after", "</think>") == (
        {"json_schema": {"enum": ["red", "green"]}, "start_after": "</think>"}, "--json-schema")
    assert parse("--json-schema", '{"type": "integer"}') == ({"json_schema": {"type": "integer"}},
                                                             "--json-schema")
    assert parse("--grammar", str(grammar)) == ({"grammar": 'start: "x"+'}, "--grammar")
    assert parse("--grammar", 'start: "y"') == ({"grammar": 'start: "y"'}, "--grammar")
    assert parse("--json-object") == ({"json_object": True}, "--json-object")


@pytest.mark.parametrize("options,needle", [
    (["--regex", "a", "--choice", "b"], "not allowed with argument --regex"),
    (["--json-object", "--grammar", "start: 'x'"], "not allowed with argument --json-object"),
    (["--regex", "[a-"], "--regex: invalid regex"),
    (["--json-schema", '{"type": "foo"}'], "--json-schema: invalid json_schema"),
    (["--json-schema", "{oops"], "--json-schema: no such file, and the value is not valid JSON"),
    (["--json-schema", "[1]"], "--json-schema: a JSON Schema is an object"),
    (["--structured-start-after", "</think>"], "--structured-start-after: needs one of"),
], ids=["two-kinds", "two-kinds-2", "bad-regex", "bad-schema", "bad-json", "not-object", "no-kind"])
def test_constraint_mistakes_are_usage_errors(tmp_path, capsys, options, needle):
    """Caught before any checkpoint is read (the model path does not exist)."""
    try:
        code = main(["generate", "--model", str(tmp_path / "none"), "--prompt", "x", *options])
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert needle in err.splitlines()[-1], err  # argparse's own errors print the usage first
