"""StructuredManager on its own: masks follow the tokens, the trigger, rollback (also across the trigger)
and draft rows for speculation, all against freshly built states."""

from __future__ import annotations

import time

import numpy as np
import pytest

from deepinfer.engine.sequence import Request, Sequence
from deepinfer.sampling import SamplingParams
from deepinfer.structured.manager import StructuredManager

PROMPT = [0, 5, 6]


@pytest.fixture(scope="module")
def manager(synthetic_tokenizer):
    return StructuredManager(synthetic_tokenizer, synthetic_tokenizer.vocab_size, 1)


def seq(seq_id: int, tokens: list[int], **so) -> Sequence:
    req = Request(f"r{seq_id}", None, PROMPT, SamplingParams(structured_outputs=so), 0, time.time(), False)
    return Sequence(seq_id, req, 0, 0, [*PROMPT, *tokens], None, 1000, len(PROMPT))


def no_flight(s: Sequence) -> int:
    raise AssertionError("every token is on the host here")


def mask_at(manager: StructuredManager, s: Sequence) -> np.ndarray:
    out = manager.fill([s], [len(s.token_ids)], no_flight)
    assert out is not None
    return out[0]


def allowed(row: np.ndarray, vocab: int) -> set[int]:
    bits = np.unpackbits(row.view(np.uint8), bitorder="little")[:vocab]
    return set(np.flatnonzero(bits).tolist())


def test_masks_trigger_rollback_and_draft_rows(manager, synthetic_tokenizer):
    enc = synthetic_tokenizer.tokenizer.encode
    think = synthetic_tokenizer.tokenizer.token_to_id("</think>")
    so = {"json_schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
          "start_after": "</think>"}
    reasoning = enc("some thoughts", add_special_tokens=False).ids
    answer = enc('{"a": 12', add_special_tokens=False).ids
    tokens = [*reasoning, think, *answer]

    free = seq(1, reasoning, **so)
    v = manager.vocab_size
    assert len(allowed(mask_at(manager, free), v)) == v  # before the trigger: all free

    grown = seq(2, [], **so)
    rows = []
    for t in tokens:  # one token per step, like decoding
        rows.append(mask_at(manager, grown))
        grown.token_ids.append(t)
    rows.append(mask_at(manager, grown))
    first = enc("{", add_special_tokens=False).ids[0]
    assert allowed(rows[len(reasoning) + 1], v) == {first}  # after the trigger: JSON only
    last = allowed(rows[-1], v)
    assert 1 not in last and enc("}", add_special_tokens=False).ids[0] in last

    for n in (2, len(answer) + 1, len(answer) + 3):  # within the grammar, the trigger, the reasoning
        fresh = seq(10 + n, tokens[:-n], **so)
        manager.rollback(2, n)
        del grown.token_ids[-n:]
        np.testing.assert_array_equal(mask_at(manager, grown), mask_at(manager, fresh))
        grown.token_ids += tokens[len(tokens) - n:]
        np.testing.assert_array_equal(mask_at(manager, grown), rows[-1])

    # speculation: rows for drafts are the rows decoding would have produced, and nothing sticks
    start = len(reasoning) + 1
    base = seq(3, tokens[:start], **so)
    drafts = tokens[start:]
    draft_rows = manager.draft_rows(base, len(base.token_ids), drafts, no_flight)
    for j in range(len(drafts) + 1):
        np.testing.assert_array_equal(draft_rows[j], rows[start + j], err_msg=f"row {j}")
    np.testing.assert_array_equal(mask_at(manager, base), rows[start])
    bad = manager.draft_rows(base, len(base.token_ids), [think, *drafts], no_flight)
    assert (bad[1:] == -1).all(), "rows after a rejected draft stay open"
