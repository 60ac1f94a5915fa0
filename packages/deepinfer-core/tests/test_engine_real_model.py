"""The engine invariants again, on the real DeepSeek-V4.1 runtime (tiny checkpoint, reference backend)."""

from __future__ import annotations

import threading
from functools import partial

import pytest
import torch

from deepinfer.engine import EngineConfig, LLMEngine
from deepinfer.engine.loader import load_model
from deepinfer.engine.scheduler import PLACEHOLDER
from deepinfer.sampling import SamplingParams
from deepinfer.sampling.sampler import SampleOutput, Sampler
from deepinfer.testing.engine import run_requests

PROMPTS = [[0, *range(5 + 3 * i, 5 + 3 * i + 6 + 9 * i)] for i in range(4)]


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    """Loaded once: each engine below re-allocates its cache, so runs do not share state."""
    return load_model(tiny_checkpoint)


run = partial(run_requests, max_model_len=256, max_num_seqs=8)


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


def test_async_inputs_are_corrected_on_the_device(model, monkeypatch):
    """Async scheduling: a decode whose last token is still being sampled reaches the model only as
    `input_ids` written on the device from the previous step's sampled tensor; the worker thread never
    reads a sampled token on the host (only post-processing does), and outputs equal sync mode."""
    samples: list[SampleOutput] = []
    host_reads: list[str] = []
    corrected = []
    sample, forward, token_ids = Sampler.__call__, model.forward, SampleOutput.token_ids.fget

    def record_sample(self, logits, rows):
        samples.append(sample(self, logits, rows))
        return samples[-1]

    def read_on_host(self):
        host_reads.append(threading.current_thread().name)
        return token_ids(self)

    def check_forward(batch):
        holes = [(i, seg) for i, seg in enumerate(batch.segments) if PLACEHOLDER in seg.token_ids]
        if holes:
            assert batch.input_ids is not None and samples
            prev = samples[-1].tokens  # the device tensor, never its host copy
            assert batch.input_ids.device == prev.device
            starts = [0, *torch.tensor([len(s.token_ids) for s in batch.segments]).cumsum(0).tolist()]
            for i, seg in holes:
                assert seg.token_ids.index(PLACEHOLDER) == len(seg.token_ids) - 1
                corrected.append(int(batch.input_ids[starts[i + 1] - 1]) in prev.tolist())
        return forward(batch)

    monkeypatch.setattr(Sampler, "__call__", record_sample)
    monkeypatch.setattr(SampleOutput, "token_ids", property(read_on_host))
    monkeypatch.setattr(model, "forward", check_forward)
    reqs = [(p, SamplingParams(temperature=0.8, seed=i, max_tokens=6, ignore_eos=True, logprobs=1))
            for i, p in enumerate(PROMPTS)]
    asyn, _ = run(model, reqs, max_num_batched_tokens=16)
    assert corrected and all(corrected)
    assert host_reads and not any(name.startswith("deepinfer-step") for name in host_reads)
    sync, _ = run(model, reqs, async_scheduling=False)
    assert asyn == sync
