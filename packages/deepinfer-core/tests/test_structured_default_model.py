"""Structured output on the trained default model (checkpoints/tiny-stdlib, Python source): greedy
constrained completions are valid, and stay the model's own choices where the constraint leaves room."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import torch

from deepinfer import LLM, SamplingParams

MODEL = Path(__file__).resolve().parents[3] / "checkpoints" / "tiny-stdlib"
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 16},
    "version": {"type": "integer", "minimum": 0, "maximum": 99},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
}, "required": ["name", "version", "tags"], "additionalProperties": False}
METHOD = r"def [a-z_]{1,20}\(self(, [a-z_]{1,10}){0,3}\):"
TOOL = {"type": "object", "properties": {"path": {"type": "string", "maxLength": 20},
                                         "mode": {"type": "string", "enum": ["r", "w"]}},
        "required": ["path", "mode"]}

recipe = pytest.importorskip("deepseek_recipe")


@pytest.mark.slow
@pytest.mark.skipif(not (MODEL / "config.json").exists(), reason="the default model is not shipped here")
def test_constrained_greedy_outputs_on_the_trained_model():
    torch.set_num_threads(1)
    llm = LLM(MODEL)
    greedy = {"temperature": 0, "max_tokens": 96}
    requests = [
        ("import json\n\nconfig = ", {"json_schema": SCHEMA}),
        ("class Parser:\n    ", {"regex": METHOD}),
        ("import os\n", {"json_schema": SCHEMA, "start_after": "\n"}),
        ("def main():\n    ", {"tools": {"tools": [{"name": "open_file", "parameters": TOOL}],
                                         "mode": "required", "opened": True}}),
    ]
    outs = llm.generate([p for p, _ in requests],
                        [SamplingParams(**greedy, skip_special_tokens=False, structured_outputs=so)
                         for _, so in requests])
    texts = [o.outputs[0].text for o in outs]
    assert all(o.outputs[0].finish_reason == "stop" for o in outs), texts
    jsonschema.validate(json.loads(texts[0]), SCHEMA)
    assert re.fullmatch(METHOD, texts[1])
    free, _, answer = texts[2].partition("\n")
    jsonschema.validate(json.loads(answer), SCHEMA)
    assert free, texts[2]  # a free code line, then the object
    body = {"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": "open it"}],
            "tools": [{"type": "function", "function": {"name": "open_file", "parameters": TOOL}}],
            "tool_choice": "required", "thinking": {"type": "disabled"}}
    req = recipe.ChatCompletionRequest(body).convert(recipe.ConversionOptions())
    gen = recipe.ChatCompletionRequest.chunk_generator(req, "x", "DeepSeek-V4.1-Flash")
    proc = recipe.StreamProcessor(gen, req.parsing_options, None)
    response = recipe.ChatCompletionResponse("x", "DeepSeek-V4.1-Flash", 0, 1, 0)
    for chunk in (recipe.InferenceChunk.ready(), recipe.InferenceChunk.text(texts[3]),
                  recipe.InferenceChunk.finish(recipe.InferenceFinishReason.Stop)):
        for event in proc.push(chunk):
            response.accumulate(event)
    for event in proc.finish():
        response.accumulate(event)
    calls = json.loads(response.to_json())["choices"][0]["message"]["tool_calls"]
    assert calls and all(c["function"]["name"] == "open_file" for c in calls), texts[3]
    for call in calls:
        jsonschema.validate(json.loads(call["function"]["arguments"]), TOOL)
