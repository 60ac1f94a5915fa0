"""Request lifecycle on the toy model: abort, rejection, over-long prompts, n > 1, streaming, logprobs."""

from __future__ import annotations

import gc

import pydantic
import pytest

from deepinfer.models.interface import ForwardBatch, SequenceSegment
from deepinfer.sampling import SamplingParams

PROMPT = [7, 8, 9, 10, 11]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_abort_frees_everything(make_engine, drain, async_scheduling):
    engine = make_engine(async_scheduling=async_scheduling)
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True, n=2)
    for i in range(6):
        engine.add_request([*PROMPT, i], params, request_id=f"r{i}")
    for _ in range(4):
        engine.step()
    assert engine.cache.free_blocks < engine.cache.num_blocks
    assert engine.abort("r1") and engine.abort("r4") and not engine.abort("nope")
    engine.add_request(PROMPT, params, request_id="late")
    early = {o.request_id: o for o in engine.step()}  # the aborted ones report at the next step
    assert engine.abort("late")  # aborted during its prefill
    done = early | drain(engine)  # drain also asserts every block and slot is free again
    for rid in ("r1", "r4", "late"):
        assert done[rid].finished and {c.finish_reason for c in done[rid].outputs} == {"abort"}
    assert all(c.finish_reason == "length" and len(c.token_ids) == 60
               for rid in ("r0", "r2", "r3", "r5") for c in done[rid].outputs)


@pytest.mark.parametrize("bad", [
    {"temperature": -0.5}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -3}, {"bogus_key": 1},
    {"min_tokens": 9, "max_tokens": 4}, {"n": 0}, {"logit_bias": {5: 500.0}}, {"stop": [""]},
    {"temperature": float("nan")}, {"stop_token_ids": [2.0]}, {"stop_token_ids": [True]}, {"max_tokens": 1.5},
])
def test_malformed_params_rejected_before_any_work(bad):
    with pytest.raises(pydantic.ValidationError):
        SamplingParams(**bad)


def test_malformed_request_rejected_while_others_finish(make_engine, drain):
    engine = make_engine()
    engine.add_request(PROMPT, {"temperature": 0, "max_tokens": 8}, request_id="good1")
    for bad_prompt, bad_params in [
        (PROMPT, {"temperature": -1}),
        (PROMPT, {"top_p": 2}),
        (PROMPT, {"unknown": True}),
        ([1, 2, 10**6], {}),  # id outside the vocabulary
        ([], {}),
        (PROMPT, {"stop_token_ids": [10**6]}),
        ("text without tokenizer", {}),
        (PROMPT, {"stop": ["x"]}),  # stop strings need a tokenizer
    ]:
        with pytest.raises(ValueError):
            engine.add_request(bad_prompt, bad_params)
    engine.step()
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request(PROMPT, {}, request_id="good1")
    engine.add_request(PROMPT, SamplingParams(seq_seed=5, max_tokens=8), request_id="good2")
    done = drain(engine)
    assert set(done) == {"good1", "good2"}
    assert all(len(o.outputs[0].token_ids) <= 8 for o in done.values())


def test_over_long_prompt_finishes_at_once(make_engine, drain):
    engine = make_engine(max_model_len=32)
    engine.add_request(list(range(3, 40)), {}, request_id="long")
    engine.add_request(PROMPT, {"max_tokens": 100, "ignore_eos": True, "temperature": 0}, request_id="ok")
    done = drain(engine)
    assert done["long"].outputs[0].finish_reason == "prompt_length_exceeded"
    assert done["long"].outputs[0].token_ids == []
    assert done["ok"].outputs[0].finish_reason == "length"
    assert len(PROMPT) + len(done["ok"].outputs[0].token_ids) == 32  # stopped at max_model_len


@pytest.mark.parametrize("fork", [True, False])
def test_n_completions(make_engine, drain, toy_models, fork):
    model = toy_models[0]() if fork else toy_models[1]()
    engine = make_engine(model=model)
    engine.add_request(list(range(3, 30)), SamplingParams(n=4, temperature=1.0, seed=9, max_tokens=12,
                                                          ignore_eos=True), request_id="n4")
    done = drain(engine)
    outs = done["n4"].outputs
    assert [c.index for c in outs] == [0, 1, 2, 3]
    assert all(len(c.token_ids) == 12 for c in outs)
    assert len({tuple(c.token_ids) for c in outs}) == 4  # independent draws
    # completion 0 is what the same seed gives with n = 1; the others depend only on (seed, index)
    single = make_engine()
    single.add_request(list(range(3, 30)), SamplingParams(temperature=1.0, seed=9, max_tokens=12,
                                                          ignore_eos=True), request_id="n1")
    assert drain(single)["n1"].outputs[0].token_ids == outs[0].token_ids


def test_n_shares_prefill_and_matches_unshared(make_engine, drain, toy_models):
    prompt = list(range(3, 30))
    params = SamplingParams(n=3, temperature=0.9, seed=4, max_tokens=10, ignore_eos=True)
    results, prompt_tokens = [], []
    for model in (toy_models[0](), toy_models[1]()):
        engine = make_engine(model=model, max_num_batched_tokens=64)
        engine.add_request(prompt, params, request_id="x")
        results.append([c.token_ids for c in drain(engine)["x"].outputs])
        prompt_tokens.append(sum(s.num_tokens for s in engine.stats.steps))
    assert results[0] == results[1]
    assert prompt_tokens[0] < prompt_tokens[1] - len(prompt)  # the prompt ran once, not three times


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_streaming_deltas_add_up(make_engine, async_scheduling):
    engine = make_engine(async_scheduling=async_scheduling)
    params = SamplingParams(temperature=0, max_tokens=15, ignore_eos=True, logprobs=1)
    engine.add_request(PROMPT, params, request_id="s", stream=True)
    engine.add_request(PROMPT, params, request_id="f")
    pieces, final = [], None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == "s":
                pieces.append(out.outputs[0])
            else:
                final = out
    assert len(pieces) == 15 and pieces[-1].finish_reason == "length"
    assert [t for p in pieces for t in p.token_ids] == final.outputs[0].token_ids
    assert sum(len(p.logprobs) for p in pieces) == 15 == len(final.outputs[0].logprobs)
    m = final.metrics
    assert m.ttft is not None and m.ttft >= 0 and m.tpot is not None and m.num_output_tokens == 15


def test_logprobs_and_prompt_logprobs(make_engine, drain):
    engine = make_engine(max_num_batched_tokens=8)  # prompt logprobs gathered over several chunks
    prompt = list(range(20, 40))
    engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=5, logprobs=3, prompt_logprobs=2,
                                              ignore_eos=True), request_id="lp")
    out = drain(engine)["lp"]
    comp = out.outputs[0]
    assert len(comp.logprobs) == 5
    for tok, lp in zip(comp.token_ids, comp.logprobs):
        assert lp.token_id == tok and len(lp.top) == 3
        assert lp.top[0][0] == tok  # greedy picks the most likely token
        assert lp.logprob == pytest.approx(lp.top[0][1])
    assert comp.cumulative_logprob == pytest.approx(sum(lp.logprob for lp in comp.logprobs))
    plp = out.prompt_logprobs
    assert len(plp) == len(prompt) and plp[0] is None
    # each entry is the raw log-softmax of the model's logits at the previous position
    model = engine.model
    model.reset_slot(1)
    ref = model.forward(ForwardBatch([SequenceSegment(1, list(range(1, 7)), 0, prompt, "all")]))
    ref = ref.logits.log_softmax(-1)
    for i in range(1, len(prompt)):
        assert plp[i].token_id == prompt[i]
        assert plp[i].logprob == pytest.approx(float(ref[i - 1, prompt[i]]), abs=1e-5)
        assert len(plp[i].top) == 2 and plp[i].top[0][1] == pytest.approx(float(ref[i - 1].max()), abs=1e-5)


def test_cuda_engines_freeze_their_startup_objects(make_engine, toy_models, monkeypatch):
    from deepinfer.engine import EngineConfig, LLMEngine, llm_engine

    before = gc.get_freeze_count()
    make_engine()  # a CPU engine leaves the collector alone
    assert gc.get_freeze_count() == before
    try:
        llm_engine.freeze_startup_objects()
        assert gc.get_freeze_count() > before
    finally:
        gc.unfreeze()
    # an engine for a CUDA device calls it once, at the end of its start-up (a CPU toy model stands in:
    # with an explicit cache size start-up asks the device nothing)
    calls = []
    monkeypatch.setattr(llm_engine, "freeze_startup_objects", lambda: calls.append(1))
    config = EngineConfig(max_model_len=96, max_num_seqs=8, cache_bytes=1 << 20, log_stats_interval=0)
    LLMEngine(toy_models[0](), None, config, device="cpu").close()
    assert calls == []
    LLMEngine(toy_models[0](), None, config, device="cuda").close()
    assert calls == [1]
