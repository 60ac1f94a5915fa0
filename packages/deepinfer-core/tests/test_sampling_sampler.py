"""Sampler and counter-based RNG: processing steps, determinism, independence from the batch."""

from __future__ import annotations

import pytest
import torch

from deepinfer.sampling import Sampler, SampleRow, SamplingParams, rng
from deepinfer.testing.recorder import rerun_recorder

V = 50


def splitmix_reference(x: int) -> int:
    m = (1 << 64) - 1
    z = (x + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def test_rng_matches_uint64_reference():
    m = (1 << 64) - 1
    seeds = [0, 1, 2**63 + 5, 2**64 - 1, 123456789]
    positions = [0, 1, 7, 10**6, 2**40]
    u = rng.uniform(torch.tensor([rng.as_int64(s) for s in seeds]), torch.tensor(positions), 3).tolist()
    for s, p, got in zip(seeds, positions, u):
        key = s ^ ((p * 0xD6E8FEB86659FD93) & m) ^ ((3 * 0xA0761D6478BD642F) & m)
        want = (splitmix_reference(splitmix_reference(key)) >> 11) / 2**53
        assert got == want
    assert all(0.0 <= x < 1.0 for x in u)


def test_rng_uniformity():
    u = rng.uniform(torch.full((20000,), 42), torch.arange(20000), 0)
    hist = torch.histc(u.float(), bins=10, min=0, max=1)
    assert (hist - 2000).abs().max() < 200


def row(position=10, **kw) -> SampleRow:
    return SampleRow(SamplingParams(**kw), seed=rng.as_int64(kw.get("seed") or 7), position=position,
                     num_outputs=kw.pop("num_outputs", 5) if "num_outputs" in kw else 5)


def logits(n=1, seed=0) -> torch.Tensor:
    return torch.randn(n, V, generator=torch.Generator().manual_seed(seed)) * 2


def test_greedy_and_degenerate_filters_agree():
    x = logits(1)
    best = int(x.argmax())
    s = Sampler(eos_token_id=1)
    for kw in ({"temperature": 0}, {"top_k": 1}, {"top_p": 1e-6}, {"min_p": 1.0}):
        assert s(x, [row(**kw)]).token_ids == [best]


def test_top_k_and_top_p_restrict_support():
    x = logits(1)
    s = Sampler(eos_token_id=1)
    top3 = set(x[0].topk(3).indices.tolist())
    probs = torch.softmax(x[0], -1)
    sp, order = probs.sort(descending=True)
    nucleus = set(order[: int((sp.cumsum(0) < 0.5).sum()) + 1].tolist())
    for pos in range(200):
        assert s(x, [row(position=pos, top_k=3)]).token_ids[0] in top3
        assert s(x, [row(position=pos, top_p=0.5)]).token_ids[0] in nucleus


def test_sampling_follows_the_distribution():
    x = logits(1, seed=3)
    s = Sampler(eos_token_id=None)
    n = 4000
    rows = [row(position=p, temperature=0.8) for p in range(n)]
    got = torch.bincount(torch.tensor(s(x.expand(n, V), rows).token_ids), minlength=V).float() / n
    want = torch.softmax(x[0] / 0.8, -1)
    assert (got - want).abs().max() < 0.03


def test_logit_bias_min_tokens_and_penalties():
    x = torch.zeros(1, V)
    s = Sampler(eos_token_id=1)
    assert s(x, [row(temperature=0, logit_bias={17: 5.0})]).token_ids == [17]
    x[0, 1] = 10.0  # EOS dominates
    assert s(x, [row(temperature=0)]).token_ids == [1]
    banned = s(x, [SampleRow(SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[2]), 0, 4, 1)])
    assert banned.token_ids[0] not in (1, 2)
    assert s(x, [SampleRow(SamplingParams(temperature=0, min_tokens=3), 0, 4, 3)]).token_ids == [1]
    y = torch.zeros(1, V)
    y[0, 5], y[0, 6] = 3.0, 2.5
    hist = SampleRow(SamplingParams(temperature=0, frequency_penalty=0.4), 0, 9, 3, output_ids=[5, 5])
    assert s(y, [hist]).token_ids == [6]  # 3.0 - 0.8 < 2.5
    pres = SampleRow(SamplingParams(temperature=0, presence_penalty=0.4), 0, 9, 3, output_ids=[5, 5])
    assert s(y, [pres]).token_ids == [5]  # 3.0 - 0.4 > 2.5
    rep = SampleRow(SamplingParams(temperature=0, repetition_penalty=1.5), 0, 9, 3, prompt_ids=[5])
    assert s(y, [rep]).token_ids == [6]  # 3.0 / 1.5 < 2.5


def test_rows_do_not_depend_on_the_batch():
    x = logits(6, seed=5)
    s = Sampler(eos_token_id=1)
    kws = [{"temperature": 1.0, "seed": 1}, {"temperature": 0.5, "top_p": 0.8, "seed": 2}, {"temperature": 0},
           {"top_k": 5, "seed": 3}, {"min_p": 0.1, "seed": 4, "logprobs": 2}, {"temperature": 1.5, "seed": 5}]
    rows = [row(position=20 + i, **kw) for i, kw in enumerate(kws)]
    batch = s(x, rows)
    for i in range(6):
        alone = s(x[i:i + 1], [rows[i]])
        assert alone.token_ids[0] == batch.token_ids[i]
    perm = [3, 0, 5, 1, 4, 2]
    shuffled = s(x[perm], [rows[i] for i in perm])
    assert shuffled.token_ids == [batch.token_ids[i] for i in perm]
    lp = batch.logprobs[4]
    assert lp is not None and len(lp.top) == 2
    assert lp.logprob == pytest.approx(float(torch.log_softmax(x[4], -1)[lp.token_id]))


def test_recorded_sampling_draws_the_eager_tokens():
    """Plain rows of up to 16 go through recorded `sample_tokens` (one per bucket, drawn and filtered
    kind), padded with greedy rows; other steps, and every step after a failed recording, run eagerly.
    Tokens equal the eager sampler's throughout."""
    g = torch.Generator().manual_seed(3)
    kinds = [dict(temperature=0), dict(temperature=1.0, seed=5), dict(temperature=0.7, top_k=5, seed=2),
             dict(temperature=1.3, top_p=0.8, min_p=0.05, seed=9)]
    eager, graphed = Sampler(eos_token_id=0), Sampler(eos_token_id=0)
    graphed.recorder = rerun_recorder
    for n, pick in ((1, [1]), (3, [0, 0, 0]), (3, [1, 0, 1]), (5, [2, 3, 1, 0, 1]), (16, [1] * 16),
                    (3, [1, 1, 0]), (17, [1] * 17)):
        logits = torch.randn(n, V, generator=g) * 3
        rows = [row(position=11 + i, **kinds[k]) for i, k in enumerate(pick)]
        assert graphed(logits, rows).token_ids == eager(logits, rows).token_ids, (n, pick)
    assert set(graphed._graphs.graphs) == {(1, True, False), (4, False, False), (4, True, False),
                                           (8, True, True), (16, True, False)}
    special = [row(temperature=1.0, seed=1, logprobs=2), row(temperature=0, presence_penalty=0.5)]
    logits = torch.randn(2, V, generator=g)
    out = graphed(logits, special)
    assert out.token_ids == eager(logits, special).token_ids and out.logprobs[0] is not None
    assert len(graphed._graphs.graphs) == 5  # eager: nothing recorded

    def failing(step):
        raise RuntimeError("operation not permitted when stream is capturing")

    broken = Sampler(eos_token_id=0)
    broken.recorder = failing
    rows = [row(temperature=1.0, seed=4)]
    logits = torch.randn(1, V, generator=g)
    assert broken(logits, rows).token_ids == eager(logits, rows).token_ids
    assert broken._graphs.failed and broken(logits, rows).token_ids == eager(logits, rows).token_ids


def test_graphs_recorded_ahead_serve_every_step(caplog: pytest.LogCaptureFixture):
    """`record_graphs` (the engine's start-up) records each bucket up to the one holding max_rows (at most
    GRAPH_ROWS), of the three kinds: steps then record nothing. A recording that fails there is logged
    once and every step samples eagerly."""
    g = torch.Generator().manual_seed(4)
    eager, calls = Sampler(eos_token_id=0), []
    kinds = [dict(temperature=0), dict(temperature=1.0, seed=5), dict(temperature=0.7, top_k=5, seed=2)]
    for max_rows, buckets in ((5, (1, 2, 4, 8)), (40, (1, 2, 4, 8, 16))):
        ahead = Sampler(eos_token_id=0)
        ahead.recorder = lambda step: calls.append(step) or rerun_recorder(step)
        ahead.record_graphs(V, torch.device("cpu"), max_rows)
        keys = {(b, *kind) for b in buckets for kind in ((False, False), (True, False), (True, True))}
        assert set(ahead._graphs.graphs) == keys and len(calls) == len(keys)
        for n, pick in ((1, [0]), (2, [1, 2]), (5, [0, 0, 1, 0, 0]), (4, [0, 2, 2, 0])):
            logits = torch.randn(n, V, generator=g) * 3
            rows = [row(position=5 + i, **kinds[k]) for i, k in enumerate(pick)]
            assert ahead(logits, rows).token_ids == eager(logits, rows).token_ids, (n, pick)
        assert len(calls) == len(keys)
        calls.clear()

    def failing(step):
        raise RuntimeError("operation not permitted when stream is capturing")

    broken = Sampler(eos_token_id=0)
    broken.recorder = failing
    with caplog.at_level("WARNING", logger="deepinfer.sampling.sampler"):
        broken.record_graphs(V, torch.device("cpu"), 16)
    assert broken._graphs.failed and not broken._graphs.graphs and caplog.text.count("failed") == 1
    rows = [row(temperature=1.0, seed=4)]
    logits = torch.randn(1, V, generator=g)
    assert broken(logits, rows).token_ids == eager(logits, rows).token_ids


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_recorded_sampling_on_cuda_draws_the_eager_tokens():
    """The cuda backend's `sample_tokens` captured in CUDA graphs (the decode graphs' recorder) draws
    the eager kernels' tokens at the real vocabulary, across buckets, kinds and steps."""
    from deepinfer.models.deepseek_v41.graphs import CudaRecorder
    from deepinfer.ops import get_ops

    device, vocab = torch.device("cuda"), 129280
    ops = get_ops("cuda", device)
    eager, graphed = Sampler(0, ops), Sampler(0, ops)
    graphed.recorder = CudaRecorder(device)
    g = torch.Generator(device=device).manual_seed(1)
    kinds = [dict(temperature=0), dict(temperature=1.0, seed=5), dict(temperature=0.8, top_p=0.9, seed=2)]
    for step in range(3):
        for n, pick in ((1, [1]), (3, [1, 0, 1]), (2, [2, 1]), (16, [1] * 16)):
            logits = torch.randn(n, vocab, generator=g, device=device) * 4
            rows = [row(position=100 * step + i, **kinds[k]) for i, k in enumerate(pick)]
            assert graphed(logits, rows).token_ids == eager(logits, rows).token_ids, (step, n, pick)
    assert not graphed._graphs.failed
    assert set(graphed._graphs.graphs) == {(1, True, False), (4, True, False), (2, True, True),
                                           (16, True, False)}
