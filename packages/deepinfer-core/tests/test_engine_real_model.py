"""The engine invariants again, on the real DeepSeek-V4.1 runtime (tiny checkpoint, reference backend)."""

from __future__ import annotations

import pytest

from deepinfer.engine import EngineConfig, LLMEngine
from deepinfer.engine.loader import load_model
from deepinfer.sampling import SamplingParams

PROMPTS = [[0, *range(5 + 3 * i, 5 + 3 * i + 6 + 9 * i)] for i in range(4)]


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    """Loaded once: each engine below re-allocates its cache, so runs do not share state."""
    return load_model(tiny_checkpoint)


def run(model, reqs, **config) -> tuple[dict[str, list[list[int]]], LLMEngine]:
    config = {"max_model_len": 256, "max_num_seqs": 8, "cache_bytes": 16 << 20, "log_stats_interval": 0,
              **config}
    engine = LLMEngine(model, None, EngineConfig(**config))
    for i, (ids, params) in enumerate(reqs):
        engine.add_request(ids, params, request_id=f"r{i}")
    done = {}
    while engine.has_unfinished_requests():
        done |= {o.request_id: [c.token_ids for c in o.outputs] for o in engine.step() if o.finished}
    engine.close()
    assert engine.cache.all_free()
    return done, engine


def test_greedy_batch_equals_alone_and_async_equals_sync(model):
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    reqs = [(p, greedy) for p in PROMPTS]
    batched, engine = run(model, reqs, max_num_batched_tokens=16)  # async, chunked prefill
    assert max(s.num_seqs for s in engine.stats.steps) > 1
    for i, req in enumerate(reqs):
        alone, _ = run(model, [req], async_scheduling=False)
        assert alone["r0"] == batched[f"r{i}"], f"request {i}"


def test_preemption_and_seeded_sampling(model):
    layout = model.cache_layout()
    # 4 blocks of 128 tokens for 4 sequences that each outgrow one block: preemption by recompute
    tight = 5 * layout.bytes_per_slot + 5 * layout.bytes_per_block
    reqs = [([0, *range(10 + i, 130 + i)], SamplingParams(temperature=0.8, seed=7 + i, max_tokens=16,
                                                          ignore_eos=True)) for i in range(4)]
    roomy, _ = run(model, reqs, max_num_seqs=4)
    squeezed, engine = run(model, reqs, max_num_seqs=4, cache_bytes=tight)
    assert engine.cache.num_blocks == 4 and engine.scheduler.num_preemptions > 0
    assert squeezed == roomy
    reordered, _ = run(model, reqs[::-1], max_num_seqs=4)
    assert [reordered[f"r{3 - i}"] for i in range(4)] == [roomy[f"r{i}"] for i in range(4)]


def test_n_and_abort(model):
    engine = LLMEngine(model, None,
                       EngineConfig(max_model_len=128, max_num_seqs=8, cache_bytes=16 << 20,
                                    log_stats_interval=0))
    engine.add_request(PROMPTS[1], SamplingParams(n=3, seed=1, max_tokens=6, ignore_eos=True), request_id="n")
    engine.add_request(PROMPTS[2], SamplingParams(max_tokens=50, ignore_eos=True), request_id="gone")
    done = {}
    for _ in range(3):
        done |= {o.request_id: o for o in engine.step()}
    engine.abort("gone")
    while engine.has_unfinished_requests():
        done |= {o.request_id: o for o in engine.step() if o.finished}
    engine.close()
    assert done["gone"].outputs[0].finish_reason == "abort"
    assert [len(c.token_ids) for c in done["n"].outputs] == [6, 6, 6]
    assert engine.cache.all_free()


@pytest.mark.parametrize("bad", [{"top_p": 0}, {"temperature": -1}, {"nope": 1}])
def test_bad_request_rejected_on_real_model(model, bad):
    engine = LLMEngine(model, None, EngineConfig(max_model_len=64, cache_bytes=8 << 20))
    with pytest.raises(ValueError):
        engine.add_request(PROMPTS[0], bad)
    assert not engine.has_unfinished_requests()
    engine.close()


def test_n_completions_share_the_prompt_prefill(model):
    """The V4.1 runtime copies the prompt's slot and blocks to each sibling: the same samples as n
    separate prefills, with the prompt run through the model once instead of n times."""
    params = SamplingParams(n=3, temperature=0.9, seed=3, max_tokens=8, ignore_eos=True)
    outputs, tokens = {}, {}
    for fork in (True, False):
        engine = LLMEngine(model, None, EngineConfig(max_model_len=256, cache_bytes=16 << 20,
                                                     log_stats_interval=0))
        assert engine.scheduler.can_fork
        engine.scheduler.can_fork = fork  # False: what a model without copy_slot / copy_blocks gets
        engine.add_request(PROMPTS[3], params, request_id="r")
        while engine.has_unfinished_requests():
            outputs |= {(fork, o.request_id): [c.token_ids for c in o.outputs] for o in engine.step()
                        if o.finished}
        engine.close()
        assert engine.cache.all_free()
        tokens[fork] = sum(s.num_tokens for s in engine.stats.steps)
    assert outputs[True, "r"] == outputs[False, "r"]
    assert len({tuple(t) for t in outputs[True, "r"]}) > 1  # the completions really differ
    assert tokens[False] - tokens[True] == 2 * len(PROMPTS[3])
