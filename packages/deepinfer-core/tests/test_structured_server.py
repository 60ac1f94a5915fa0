"""The server's mapping of the recipe's OutputConstraint (response_format, tools) to structured outputs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from deepinfer.entrypoints.server.pipeline import output_constraint
from deepinfer.sampling import SamplingParams

recipe = pytest.importorskip("deepseek_recipe")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def constraint(**body) -> dict | None:
    body = {"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": "answer in json"}],
            **body}
    converted = recipe.ChatCompletionRequest(body).convert(recipe.ConversionOptions())
    so = output_constraint(SimpleNamespace(recipe=recipe), converted)
    SamplingParams(structured_outputs=so)  # accepted as it is
    return so


def test_response_formats_and_tools_map_to_constraints():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert constraint(thinking={"type": "disabled"}) is None
    assert constraint(response_format={"type": "json_object"}, thinking={"type": "disabled"}) == {
        "json_object": True}
    so = constraint(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
    assert so["start_after"] == "</think>" and so["json_schema"]  # thinking on: JSON after the reasoning
    so = constraint(tools=TOOLS)
    assert so["start_after"] == "</think>" and so["tools"]["mode"] == "auto"
    assert so["tools"]["tools"][0]["name"] == "get_weather"
    so = constraint(tools=TOOLS, tool_choice="required", thinking={"type": "disabled"})
    assert "start_after" not in so and so["tools"]["mode"] == "required" and so["tools"]["opened"]
