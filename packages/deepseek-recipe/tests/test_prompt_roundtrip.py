"""Property test: rendering then prompt-encoding a conversation loses nothing.

Decoding the ids (byte-level BPE, done here in plain Python from tokenizer.json) must give back the
rendered prompt exactly, and every special range must be exactly one id, whatever the user typed —
including text that spells special tokens.
"""

import functools
import json
import pathlib
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import conversion_cases as cc

import deepseek_recipe as dr


def bytes_to_unicode():
    """The byte <-> printable character table of byte-level BPE."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


@functools.cache
def decoder():
    data = json.loads(pathlib.Path(cc.v41_tokenizer_path()).read_text(encoding="utf-8"))
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    pieces = {
        i: bytes(byte_of[c] for c in tok)
        for tok, i in data["model"]["vocab"].items()
        if all(c in byte_of for c in tok)
    }
    added = {t["id"]: t["content"].encode() for t in data["added_tokens"]}
    return {**pieces, **added}, set(added)


def decode(ids):
    table, _ = decoder()
    return b"".join(table[i] for i in ids).decode("utf-8")


SPECIALS = [
    "<｜User｜>",
    "<｜Assistant｜>",
    "<think>",
    "</think>",
    "<｜end▁of▁sentence｜>",
    "<｜DSML｜",
    "｜DSML｜",
    "<｜image｜>",
    "<｜System｜>",
    "<tool_result>",
    "\n\n",
    " ",
    "é",
    "🌍",
]
text = st.lists(st.one_of(st.text(max_size=12), st.sampled_from(SPECIALS)), max_size=6).map("".join)
tool_call = st.builds(
    lambda i, n, a: dr.ToolCall(f"c{i}", n, a),
    st.integers(0, 9),
    st.sampled_from(["get_weather", "f"]),
    st.one_of(text, st.just('{"city": "Paris", "days": 3}'), st.just("[1, 2]")),
)
message = st.one_of(
    st.builds(dr.UserMessage, text),
    st.builds(dr.SystemMessage, text),
    st.builds(
        dr.AssistantMessage,
        text,
        st.one_of(st.none(), text),
        st.one_of(st.none(), st.lists(tool_call, max_size=2)),
    ),
    st.builds(dr.ToolMessage, text, st.one_of(st.none(), st.just("c1"))),
    st.builds(dr.LatestReminderMessage, text),
)
conversation = st.builds(
    lambda messages, thinking, effort, tools: dr.Conversation(
        messages,
        thinking_mode=thinking,
        reasoning_effort=effort,
        tools=[dr.ToolDefinition("get_weather", "Weather", {"type": "object"})] if tools else None,
    ),
    st.lists(message, max_size=6),
    st.booleans(),
    st.sampled_from([None, "low", "high", "max"]),
    st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(conversation, st.booleans())
def test_render_encode_decode_round_trip(conv, v41):
    _, added_ids = decoder()
    v4_enc, v41_enc = cc.encodings(dr)
    enc, plain = (v41_enc, dr.DeepseekV41Encoding()) if v41 else (v4_enc, dr.DeepseekV4Encoding())
    rendered = plain.render_conversation(conv)
    ids = enc.encode(conv)
    assert decode(ids) == rendered.prompt
    # Exactly the rendered special ranges became added-token ids.
    assert sum(1 for i in ids if i in added_ids) == len(rendered.special_ranges)
