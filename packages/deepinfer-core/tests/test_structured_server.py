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


def test_structured_outputs_extension_field():
    """vLLM's `structured_outputs` body field (json/regex/choice/grammar/json_object) passes through;
    with response_format or tools as well it is a 400."""
    from deepinfer.entrypoints.server.errors import APIError
    from deepinfer.entrypoints.server.pipeline import sampling_params

    state = SimpleNamespace(recipe=recipe, max_model_len=4096)

    def params(**body):
        body = {"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": "answer in json"}],
                "thinking": {"type": "disabled"}, **body}
        converted = recipe.ChatCompletionRequest(dict(body)).convert(recipe.ConversionOptions())
        return sampling_params(state, converted, 10, body)

    so = params(structured_outputs={"choice": ["a", "b"]}).structured_outputs
    assert so is not None and so.choice == ["a", "b"]
    assert params(structured_outputs={"json": {"type": "object"}}).structured_outputs.kind == "json_schema"
    with pytest.raises(APIError, match="cannot be combined"):
        params(structured_outputs={"regex": "a+"}, response_format={"type": "json_object"})
    with pytest.raises(APIError, match="invalid regex"):
        params(structured_outputs={"regex": "a+("})
    thinking = params(structured_outputs={"regex": "a+"}, thinking={"type": "enabled"}).structured_outputs
    assert thinking.start_after == "</think>"
