"""Hostile Python objects at the JSON boundary: nesting bombs and self-containing objects.

Request bodies, `ToolDefinition(parameters=...)` and `Conversation(response_schema=...)` are walked into
JSON values. The official wheel bounds that walk like its JSON-text parser (at most 128 nested
containers) and reports cycles; these expectations were taken from it.
"""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import deepseek_recipe as dr

LIMIT = 128
DEPTH_ERROR = f"JSON input exceeds the maximum nesting depth of {LIMIT}"
USER = [{"role": "user", "content": "hi"}]


def nested_lists(containers: int) -> list:
    """`containers` lists, each holding the next (built iteratively: no Python recursion)."""
    value: list = []
    for _ in range(containers - 1):
        value = [value]
    return value


def body_with(extra: object) -> dict:
    """A valid Chat body whose ignored field `extra` holds the hostile value (one container deeper)."""
    return {"model": "DeepSeek-V4-Pro", "messages": USER, "extra": extra}


@pytest.mark.parametrize("request_class", [dr.ChatCompletionRequest, dr.MessagesRequest, dr.ResponsesRequest])
def test_body_at_the_limit_parses(request_class):
    request_class(
        {"model": "m", "messages": USER, "input": "hi", "max_tokens": 1, "extra": nested_lists(LIMIT - 1)}
    )


@pytest.mark.parametrize("containers", [LIMIT, LIMIT + 1, 10_000, 1_000_000])
def test_body_beyond_the_limit_raises(containers):
    with pytest.raises(RecursionError, match=DEPTH_ERROR):
        dr.ChatCompletionRequest(body_with(nested_lists(containers)))


def test_text_body_is_bounded_too():
    # serde_json's text parser stops one container earlier (127 nest), as in the official wheel.
    dr.ChatCompletionRequest(json.dumps(body_with(nested_lists(LIMIT - 2))))
    with pytest.raises(ValueError, match="invalid JSON request: recursion limit exceeded"):
        dr.ChatCompletionRequest(json.dumps(body_with(nested_lists(LIMIT - 1))))


def test_deep_schema_and_parameters_raise():
    deep: dict = {}
    for _ in range(LIMIT):
        deep = {"a": deep}
    with pytest.raises(RecursionError, match=DEPTH_ERROR):
        dr.ToolDefinition("f", parameters=deep)
    with pytest.raises(RecursionError, match=DEPTH_ERROR):
        dr.Conversation(response_schema=deep)
    assert dr.ToolDefinition("f", parameters=deep["a"]).parameters == deep["a"]


def test_self_containing_objects_raise():
    body = body_with(None)
    body["extra"] = body
    with pytest.raises(ValueError, match="circular reference in JSON input"):
        dr.ChatCompletionRequest(body)
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="circular reference in JSON input"):
        dr.ToolDefinition("f", parameters={"x": loop})
    with pytest.raises(ValueError, match="circular reference in JSON input"):
        dr.Conversation(response_schema={"items": [1, (2, loop)]})


def test_cycle_reported_before_depth():
    # The cycle closes at depth 129: the official reports the cycle, not the depth.
    outer = nested_lists(LIMIT - 1)
    inner = outer
    while inner:
        inner = inner[0]
    inner.append(outer)
    with pytest.raises(ValueError, match="circular reference"):
        dr.ChatCompletionRequest(body_with(outer))


def test_shared_objects_are_not_cycles():
    shared = {"type": "string"}
    schema = {"type": "object", "properties": {"a": shared, "b": shared}}
    assert dr.ToolDefinition("f", parameters=schema).parameters == schema


@settings(max_examples=60, deadline=None)
@given(depth=st.integers(1, 2 * LIMIT), kinds=st.lists(st.sampled_from("dlt"), min_size=1, max_size=3))
def test_any_nesting_is_accepted_or_rejected_cleanly(depth, kinds):
    value: object = 1
    for i in range(depth):
        kind = kinds[i % len(kinds)]
        value = {"k": value} if kind == "d" else [value] if kind == "l" else (value,)
    if depth + 1 <= LIMIT:
        dr.ChatCompletionRequest(body_with(value))
    else:
        with pytest.raises(RecursionError, match=DEPTH_ERROR):
            dr.ChatCompletionRequest(body_with(value))
    # The package still serves a normal request afterwards.
    assert dr.ChatCompletionRequest(body_with(None)).convert(dr.ConversionOptions()).conversation.messages
