"""Property: the stream parser's result does not depend on how a token stream is cut into pushes."""

import json
import pathlib
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import itertools

import stream_cases

import deepseek_recipe as dr

TOK = stream_cases.load_tokenizer(dr)
# JSON output mode blanks text per fragment, so its filler legitimately depends on the cuts.
OUTPUTS = [
    (text, stage, extra)
    for _, text, stage, extra in stream_cases.OUTPUTS
    if not extra.get("parse_json_output") and not extra.get("stop_sequences")
]
ENCODED = [(TOK.encode(text), stage, extra) for text, stage, extra in OUTPUTS]


def final_message(ids, cuts, stage, extra, thinking):
    gen = dr.MessagesChunkGenerator("msg_prop", "m", thinking)
    options = stream_cases.parsing_options(dr, {"thinking_initial_stage": stage, **extra})
    proc = dr.StreamProcessor(gen, options, TOK)
    events = proc.push(dr.InferenceChunk.ready(prompt_usage=dr.PromptUsage(prompt_tokens=5)))
    bounds = [0, *sorted(set(cuts)), len(ids)]
    for a, b in itertools.pairwise(bounds):
        events += proc.push(dr.InferenceChunk.tokens(ids[a:b]))
    events += proc.push(dr.InferenceChunk.finish(dr.InferenceFinishReason.Stop))
    resp = dr.MessagesResponse("msg_prop", "m", 0, 5, 0)
    for event in events:
        resp.accumulate(event)
    body = json.loads(stream_cases.normalise(resp.to_json()))
    # Tool-use input is parsed; keep the streamed argument text too by re-joining the deltas.
    body["partial_json"] = "".join(
        json.loads(e.to_json())["delta"].get("partial_json", "")
        for e in events
        if json.loads(e.to_json())["type"] == "content_block_delta"
    )
    return body


@st.composite
def split_streams(draw):
    ids, stage, extra = draw(st.sampled_from(ENCODED))
    cuts = draw(st.lists(st.integers(min_value=1, max_value=max(1, len(ids) - 1)), max_size=len(ids)))
    return ids, cuts, stage, extra, draw(st.booleans())


@settings(max_examples=150, deadline=None)
@given(split_streams())
def test_any_split_gives_the_same_message(case):
    ids, cuts, stage, extra, thinking = case
    whole = final_message(ids, [], stage, extra, thinking)
    assert final_message(ids, cuts, stage, extra, thinking) == whole
