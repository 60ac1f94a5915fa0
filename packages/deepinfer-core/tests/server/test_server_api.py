"""The server's protocols through the real openai and anthropic SDKs (one server for the module)."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from .conftest import API_KEY, MODEL

HI = [{"role": "user", "content": "Hi"}]
NO_THINK = {"thinking": {"type": "disabled"}}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def server(server_factory):
    return server_factory("--max-request-body-bytes", "65536", "--max-model-len", "1024")


@pytest.fixture(scope="module")
def client(server):
    return server.openai()


def _collect_stream(stream) -> dict[int, dict]:
    """Per choice: content, reasoning, tool calls and every finish reason seen."""
    out: dict[int, dict] = {}
    for chunk in stream:
        for ch in chunk.choices:
            acc = out.setdefault(ch.index, {"content": "", "reasoning": "", "finish": [], "tools": {}})
            d = ch.delta
            acc["content"] += d.content or ""
            acc["reasoning"] += getattr(d, "reasoning_content", None) or ""
            for call in d.tool_calls or []:
                t = acc["tools"].setdefault(call.index, {"name": "", "arguments": ""})
                t["name"] += call.function.name or ""
                t["arguments"] += call.function.arguments or ""
            if ch.finish_reason:
                acc["finish"].append(ch.finish_reason)
    return out


@pytest.mark.parametrize("thinking", [True, False])
def test_chat_stream_equals_non_stream(client, thinking):
    kw = dict(model=MODEL, messages=HI, max_tokens=12, seed=7, temperature=0.8, n=2, logprobs=True,
              top_logprobs=2, extra_body={"thinking": {"type": "enabled" if thinking else "disabled"}})
    full = client.chat.completions.create(**kw)
    streamed = _collect_stream(client.chat.completions.create(**kw, stream=True,
                                                              stream_options={"include_usage": True}))
    assert sorted(streamed) == [0, 1]
    for choice in full.choices:
        s = streamed[choice.index]
        assert s["finish"] == [choice.finish_reason]  # exactly one finish reason per choice
        assert s["content"] == (choice.message.content or "")
        assert s["reasoning"] == (getattr(choice.message, "reasoning_content", None) or "")
        assert bool(s["reasoning"]) == thinking  # thinking on: the output starts as reasoning
        lp = choice.logprobs
        n_lp = len(lp.content or []) + len(getattr(lp, "reasoning_content", None) or [])
        assert 0 < n_lp <= 12
    assert full.choices[0].message.content != full.choices[1].message.content or thinking
    assert full.usage.prompt_tokens > 0 and full.usage.completion_tokens > 0
    assert full.usage.prompt_tokens_details.cached_tokens == 0


def test_seeded_chat_is_reproducible(client):
    kw = dict(model=MODEL, messages=HI, max_tokens=10, seed=123, temperature=1.0, extra_body=NO_THINK)
    a, b = (client.chat.completions.create(**kw).choices[0].message.content for _ in range(2))
    assert a == b


def test_stop_sequence_cuts_the_output(client):
    kw = dict(model=MODEL, messages=HI, max_tokens=24, temperature=0, extra_body=NO_THINK)
    text = client.chat.completions.create(**kw).choices[0].message.content
    stop = text[len(text) // 2:len(text) // 2 + 3]
    assert stop.strip(), text
    cut = client.chat.completions.create(**kw, stop=[stop]).choices[0]
    assert cut.finish_reason == "stop" and cut.message.content == text[:text.index(stop)]
    streamed = _collect_stream(client.chat.completions.create(**kw, stop=[stop], stream=True))[0]
    assert streamed["content"] == cut.message.content and streamed["finish"] == ["stop"]


@pytest.mark.parametrize("tool_choice", ["auto", "required", {"type": "function",
                                                               "function": {"name": "get_weather"}}])
def test_tools(client, tool_choice):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS,
              tool_choice=tool_choice, max_tokens=24, seed=3, temperature=0.7, extra_body=NO_THINK)
    full = client.chat.completions.create(**kw).choices[0]
    streamed = _collect_stream(client.chat.completions.create(**kw, stream=True))[0]
    assert streamed["finish"] == [full.finish_reason]
    assert "DSML" not in (full.message.content or "")
    calls = full.message.tool_calls or []
    assert [c.function.name for c in calls] == [t["name"] for t in streamed["tools"].values()]
    assert [c.function.arguments for c in calls] == [t["arguments"] for t in streamed["tools"].values()]


def test_thinking_with_required_tool_choice_is_a_400(client):
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        client.chat.completions.create(model=MODEL, messages=HI, tools=TOOLS, tool_choice="required")


def test_completions_text_and_ids(client, server):
    kw = dict(model=MODEL, max_tokens=8, seed=5, temperature=0.9, logprobs=2)
    full = client.completions.create(prompt="The quick brown fox", **kw,
                                     extra_body={"return_token_ids": True}).choices[0]
    assert full.finish_reason == "length" and len(full.logprobs.tokens) == 8
    ids = server.http.post("/tokenize", json={"prompt": "The quick brown fox"}).json()["tokens"]
    by_ids = client.completions.create(prompt=ids, **kw, extra_body={"return_token_ids": True}).choices[0]
    assert by_ids.text == full.text and by_ids.model_extra["token_ids"] == full.model_extra["token_ids"]
    chunks = list(client.completions.create(prompt="The quick brown fox", **kw, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].usage.completion_tokens == 8


def test_messages(server):
    client = server.anthropic()
    kw = dict(model=MODEL, max_tokens=10, messages=HI, extra_body={"seed": 11})  # thinking: temperature 1
    msg = client.messages.create(**kw)
    assert msg.id.startswith("msg_") and msg.stop_reason == "max_tokens"
    assert msg.usage.input_tokens > 0 and msg.usage.output_tokens == 10
    with client.messages.stream(**kw) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_message()
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"]
    assert final.content[0].type == msg.content[0].type == "thinking"
    assert final.content[0].thinking == msg.content[0].thinking
    off = client.messages.create(model=MODEL, max_tokens=10, messages=HI, thinking={"type": "disabled"})
    assert [b.type for b in off.content] == ["text"]
    count = client.messages.count_tokens(model=MODEL, messages=HI)
    assert count.input_tokens == msg.usage.input_tokens


def test_responses_store_and_stream(client):
    kw = dict(model=MODEL, input="Hi", max_output_tokens=8, extra_body={"seed": 5})
    resp = client.responses.create(**kw)
    assert resp.id.startswith("resp_") and resp.status == "incomplete"
    assert client.responses.retrieve(resp.id).model_dump() == resp.model_dump()
    events = list(client.responses.create(**kw, stream=True))
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert types[-1] == "response.incomplete"
    seq = [e.sequence_number for e in events]
    assert seq == sorted(seq) and len(set(seq)) == len(seq)
    assert events[-1].response.output[0].content == resp.output[0].content
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_unknown")
    with pytest.raises(openai.BadRequestError, match="already finished"):
        client.responses.cancel(resp.id)


def test_tokenize_detokenize_version_models(server, client):
    ids = server.http.post("/tokenize", json={"prompt": "Hello world"}).json()
    assert server.http.post("/detokenize", json={"tokens": ids["tokens"]}).json()["prompt"] == "Hello world"
    chat = server.http.post("/tokenize", json={"model": MODEL, "messages": HI}).json()
    assert chat["count"] == client.chat.completions.create(model=MODEL, messages=HI, max_tokens=1
                                                            ).usage.prompt_tokens
    assert server.http.get("/version").json()["version"]
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_metrics_use_vllm_names(server):
    text = server.http.get("/metrics").text
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prompt_tokens_total",
                 "generation_tokens_total", "request_success_total", "time_to_first_token_seconds",
                 "inter_token_latency_seconds", "e2e_request_latency_seconds", "admission_rejections_total"):
        assert f"deepinfer:{name}" in text, name
    assert 'model_name="tiny"' in text


ROUTES = [("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
          ("POST", "/v1/responses"), ("GET", "/v1/responses/x"), ("POST", "/v1/responses/x/cancel"),
          ("POST", "/v1/messages"), ("POST", "/v1/messages/count_tokens"), ("POST", "/tokenize"),
          ("POST", "/detokenize"), ("GET", "/metrics"), ("GET", "/version")]


def test_key_required_on_every_non_health_route(server):
    import httpx

    with httpx.Client(base_url=server.url) as bare:
        for method, path in ROUTES:
            r = bare.request(method, path, json={})
            assert r.status_code == 401, (path, r.text)
            body = r.json()
            kind = body["error"]["type"]
            assert kind == "authentication_error", body
            assert (body.get("type") == "error") == path.startswith("/v1/messages")
            assert bare.request(method, path, json={}, headers={"x-api-key": "wrong"}).status_code == 401
        assert bare.get("/health").status_code == 200 and bare.get("/ready").status_code == 200
    with pytest.raises(openai.AuthenticationError):
        server.openai(default_headers={"Authorization": "Bearer nope"}).models.list()
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.url, api_key="nope", max_retries=0).messages.create(
            model=MODEL, max_tokens=1, messages=HI)
    assert API_KEY


def test_error_shapes(server, client):
    post = server.http.post

    def body(**fields):
        return json.dumps({"model": MODEL, "messages": HI, **fields}).encode()

    cases = [
        ("/v1/chat/completions", b'{"model": "tiny", "messages": [', 400, "not valid JSON"),
        ("/v1/chat/completions", b'{"model": "tiny", "messages": "\xff\xfe"}', 400, "UTF-8"),
        ("/v1/chat/completions", b"[1, 2]", 400, "JSON object"),
        ("/v1/chat/completions", body(max_tokens="x"), 400, "expected u32"),
        ("/v1/chat/completions", body(n=0), 400, "n must"),
        ("/v1/chat/completions", body(top_k=-5), 400, "top_k"),
        ("/v1/chat/completions", body(model="gpt-9"), 404, "gpt-9"),
        ("/v1/completions", json.dumps({"model": MODEL, "prompt": 5}).encode(), 400, "prompt must"),
        ("/v1/chat/completions", b'{"model": "tiny", "messages": ["' + b"a" * 70000 + b'"]}', 413, "limit"),
        ("/v1/messages", b'{"model": "tiny"', 400, "not valid JSON"),
        ("/v1/messages", body(model="gpt-9", max_tokens=1), 404, "gpt-9"),
    ]
    for path, raw, status, words in cases:
        r = post(path, content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == status, (path, raw[:60], r.text)
        err = r.json()["error"]
        assert words in err["message"], (words, err)
        if path.startswith("/v1/messages"):
            assert r.json()["type"] == "error"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-9", messages=HI)
    with pytest.raises(anthropic.NotFoundError):
        server.anthropic().messages.create(model="gpt-9", max_tokens=1, messages=HI)
    assert post("/v1/nowhere", json={}).status_code == 404
    server.wait_idle()


def test_bench_serve(server, tmp_path, capsys):
    from deepinfer.entrypoints.cli.main import main

    out = tmp_path / "bench.json"
    argv = ["bench", "serve", "--base-url", server.url, "--api-key", API_KEY, "--num-prompts", "6",
            "--input-len", "8", "--output-len", "6", "--request-rate", "50", "--max-concurrency", "3",
            "--goodput", "ttft:60000", "tpot:60000", "--json-out", str(out)]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "TTFT" in table and "goodput" in table
    results = json.loads(out.read_text())["results"]
    assert results["completed"] == 6 and results["failed"] == 0 and results["goodput"] > 0
    assert results["total_output_tokens"] == 36 and results["p99_tpot_ms"] >= results["p50_tpot_ms"] > 0


def test_responses_cancel_in_progress(client, server):
    stream = client.responses.create(model=MODEL, input="Hi", max_output_tokens=400, stream=True,
                                     extra_body={"ignore_eos": True})
    events = iter(stream)
    created = next(events)
    assert created.type == "response.created"
    rid = created.response.id
    assert client.responses.retrieve(rid).status == "in_progress"
    assert client.responses.cancel(rid).status == "cancelled"
    rest = list(events)  # the stream ends once the generation is aborted
    assert len(rest) < 400 and client.responses.retrieve(rid).status == "cancelled"
    server.wait_idle()
