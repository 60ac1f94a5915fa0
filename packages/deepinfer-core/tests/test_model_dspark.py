"""DSpark draft blocks: the context keys written by the main model's forwards (chunked, decode,
rollback) give the same drafts as a one-shot prefill; heads and conventions behave as documented."""

from __future__ import annotations

import pytest
import torch

from deepinfer.models.deepseek_v41.runtime import DeepseekV41Runtime, RuntimeOptions, load_runtime
from deepinfer.models.interface import ForwardBatch, SequenceSegment
from deepinfer.testing import write_tiny_checkpoint


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> DeepseekV41Runtime:
    path = write_tiny_checkpoint("full", tmp_path_factory.mktemp("dspark"), seed=5)
    return load_runtime(path, options=RuntimeOptions(max_backtrack=5))


def _prompt(n: int, vocab: int) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(11)).tolist()


def _prefill(rt: DeepseekV41Runtime, slot: int, ids: list[int], chunks: list[int]) -> None:
    start = 0
    for size in chunks:
        rt.forward(ForwardBatch([SequenceSegment(slot, [slot], start, ids[start : start + size], "none")]))
        start += size
    assert start == len(ids)


def _two_fresh_slots(rt: DeepseekV41Runtime) -> list[int]:
    """Empties slots 1 and 2 of a new 3-slot cache; returns the 40-token prompt both tests use."""
    rt.allocate_cache(3, 3)
    rt.reset_slot(1)
    rt.reset_slot(2)
    return _prompt(40, rt.vocab_size)


def test_drafts_from_stateful_context_equal_one_shot(runtime: DeepseekV41Runtime) -> None:
    rt, ds = runtime, runtime.dspark
    ids = _two_fresh_slots(rt)
    _prefill(rt, 1, ids[:33], [33])
    # slot 2: odd chunks, verification of wrong drafts, rollback, then the true tokens
    _prefill(rt, 2, ids[:30], [7, 11, 12])
    rt.forward(ForwardBatch([SequenceSegment(2, [2], 30, [5, 6, 7, 8], "all")]))
    rt.forward(ForwardBatch([SequenceSegment(2, [2], 30, ids[30:33], "all")]))
    out = ds.draft(rt.cache, [1, 2], [33, 33], [ids[33], ids[33]])
    assert out.base_logits.shape == (2, ds.block_size, rt.vocab_size)
    torch.testing.assert_close(out.base_logits[0], out.base_logits[1], atol=1e-4, rtol=0)
    torch.testing.assert_close(out.hidden[0], out.hidden[1], atol=1e-4, rtol=0)


def test_draft_depends_on_context_and_heads_follow_conventions(runtime: DeepseekV41Runtime) -> None:
    rt, ds = runtime, runtime.dspark
    ids = _two_fresh_slots(rt)
    _prefill(rt, 1, ids[:25], [25])
    _prefill(rt, 2, ids[:25][::-1], [25])
    out = ds.draft(rt.cache, [1, 2], [25, 25], [ids[25], ids[25]])
    assert (out.base_logits[0] - out.base_logits[1]).abs().max() > 1e-3  # the context matters
    prev = torch.tensor([ids[25 : 25 + ds.block_size]] * 2)
    markov, emb = ds.markov(prev)
    assert markov.shape == (2, ds.block_size, rt.vocab_size) and markov.dtype == torch.float32
    torch.testing.assert_close(markov[0, 0], (ds.markov_head.dense() @ ds.markov_embed[ids[25]].float()))
    raw, normed = ds.confidence(out, emb, "raw"), ds.confidence(out, emb, "normed")
    assert raw.shape == normed.shape == (2, ds.block_size)
    w = ds.confidence_proj.dense()[0]
    torch.testing.assert_close(normed[1, 2], w @ torch.cat((out.normed[1, 2].float(), emb[1, 2].float())))
    assert not torch.allclose(raw, normed)
