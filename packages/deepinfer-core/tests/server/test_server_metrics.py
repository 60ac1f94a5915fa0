"""Queue time and speculative-decoding metrics: in the engine's stats, in ServerMetrics, and on a real
`deepinfer serve --speculator ngram` after requests."""

from __future__ import annotations

import itertools

import pytest
from prometheus_client.parser import text_string_to_metric_families

from deepinfer.entrypoints.server.async_engine import EngineSnapshot, SpecCounters
from deepinfer.entrypoints.server.metrics import ServerMetrics
from deepinfer.sampling import SamplingParams

from .conftest import MODEL

K = 3
SPEC = "deepinfer:spec_decode_"
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


def samples(text: str | bytes) -> dict[tuple[str, str | None], float]:
    """(sample name, position label) -> value."""
    text = text.decode() if isinstance(text, bytes) else text
    return {(s.name, s.labels.get("position")): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def spec_values(values: dict[tuple[str, str | None], float]) -> tuple[float, float, float, list[float]]:
    """(drafts, draft tokens, accepted tokens, accepted per position) from parsed samples."""
    per_pos = sorted((int(pos), v) for (name, pos), v in values.items()
                     if name == f"{SPEC}num_accepted_tokens_per_pos_total")
    assert [p for p, _ in per_pos] == list(range(len(per_pos))), "positions are not 0..K-1"
    return (values[(f"{SPEC}num_drafts_total", None)], values[(f"{SPEC}num_draft_tokens_total", None)],
            values[(f"{SPEC}num_accepted_tokens_total", None)], [v for _, v in per_pos])


# ---- ServerMetrics, fed directly --------------------------------------------------------------------

def test_spec_counters_equal_the_engine_counts_and_start_at_zero():
    metrics = ServerMetrics("m", num_draft_tokens=K)
    snapshot = EngineSnapshot()
    assert spec_values(samples(metrics.render(snapshot, 0))) == (0, 0, 0, [0] * K)
    for counts in (SpecCounters(4, 12, 5, (3, 2)), SpecCounters(4, 12, 5, (3, 2)),
                   SpecCounters(7, 20, 10, (5, 3, 2))):
        snapshot.spec = counts
        got = spec_values(samples(metrics.render(snapshot, 0)))
        want = list(counts.accepted_per_pos) + [0] * (K - len(counts.accepted_per_pos))
        assert got == (counts.drafts, counts.draft_tokens, counts.accepted_tokens, want)


def test_no_spec_series_without_a_speculator():
    names = [name for name, _ in samples(ServerMetrics("m").render(EngineSnapshot(), 0))]
    assert not any(name.startswith(SPEC) for name in names)


def test_queue_time_observed_only_for_scheduled_requests():
    metrics = ServerMetrics("m")
    metrics.finished("stop", 5, 3, 1.0, 0.5, 0.25)
    metrics.finished("abort", 5, 0, 2.0, None, None)  # aborted while waiting: never scheduled
    values = samples(metrics.render(EngineSnapshot(), 0))
    assert values[("deepinfer:request_queue_time_seconds_count", None)] == 1
    assert values[("deepinfer:request_queue_time_seconds_sum", None)] == 0.25
    assert values[("deepinfer:request_success_total", None)] == 1  # one per finish reason


# ---- the engine's request and speculation stats ------------------------------------------------------

def test_queue_time_ends_at_first_scheduling(make_engine, drain):
    engine = make_engine(max_num_seqs=1)  # the second request waits for the first to finish
    engine.add_request(list(range(3, 20)), GREEDY, request_id="a")
    engine.add_request(list(range(3, 20)), GREEDY, request_id="b")
    done = drain(engine)
    a, b = done["a"].metrics, done["b"].metrics
    assert 0 <= a.queue_time <= a.ttft
    assert b.first_scheduled_time >= a.finish_time
    assert b.queue_time == b.first_scheduled_time - b.arrival_time >= a.finish_time - b.arrival_time


def test_queue_time_survives_preemption(make_engine):
    """A preempted request is admitted again later; its queue time still ends at its first scheduling."""
    engine = make_engine(cache_bytes=24 * 32 + 9 * 64 + 32)  # 24 blocks: too few for 8 growing sequences
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for i in range(8):
        engine.add_request([3 + (7 * i + j) % 300 for j in range(3 + 5 * i % 17)], params, request_id=f"r{i}")
    first: dict[str, float] = {}
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.metrics.first_scheduled_time
        for rid, req in engine.requests.items():
            if req.first_scheduled_time is not None:
                first.setdefault(rid, req.first_scheduled_time)
    assert engine.scheduler.num_preemptions > 0, "the cache was meant to force preemptions"
    assert done == first


@pytest.fixture
def markov_lm(toy_models):
    """The conftest's toy model with logits that depend on the last token only, greedy cycling through
    5 -> 9 -> 13 -> 7 -> 5: prompt lookup drafts partly right runs, later all-right ones."""

    class Markov(toy_models[0]):
        max_backtrack = K

        @staticmethod
        def _mix(h: int, token: int, pos: int) -> int:
            return token

    model = Markov()
    for a, b in [(5, 9), (9, 13), (13, 7), (7, 5)]:
        model.table[a, b] += 100.0
    return model


def test_accepted_per_position_sums_to_accepted_tokens(make_engine, drain, markov_lm):
    pytest.importorskip("deepinfer_spec")
    engine = make_engine(model=markov_lm, speculator="ngram", num_draft_tokens=K)
    for i in range(3):  # after "5 9 13" the prompt shows "7 9 2": the first drafts fail at position 1
        engine.add_request([5, 9, 13, 7, 9, 2, 5, 9][i:], GREEDY, request_id=f"r{i}")
    outs = drain(engine)
    stats = engine.stats
    per_pos = stats.spec_accepted_per_pos
    assert len(per_pos) == K and per_pos[0] > per_pos[1] > 0  # some runs stopped after position 0
    assert sum(per_pos) == stats.spec_accepted_tokens == sum(o.outputs[0].accept_tok for o in outs.values())
    assert stats.spec_draft_tokens == sum(o.outputs[0].draft_tok for o in outs.values())
    assert all(x >= y for x, y in itertools.pairwise(per_pos))  # accepting position j needs j-1 accepted
    assert per_pos[0] <= stats.spec_verify_steps


# ---- a real server with the n-gram speculator --------------------------------------------------------

@pytest.fixture(scope="module")
def server(server_factory):
    pytest.importorskip("deepinfer_spec")
    return server_factory("--speculator", "ngram", "--num-draft-tokens", str(K))


def test_server_metrics_after_requests(server):
    client = server.openai()
    prompt = "one two three four " * 12  # repetitive: prompt lookup finds drafts
    before = samples(server.http.get("/metrics").text)
    assert spec_values(before) == (0, 0, 0, [0] * K)
    prev = spec_values(before)
    for num_requests, n in enumerate((1, 2, 1), start=1):
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, n=n)
        values = samples(server.http.get("/metrics").text)
        drafts, drafted, accepted, per_pos = now = spec_values(values)
        assert all(x >= y for x, y in zip(now[:3], prev[:3])), "counters went down"
        assert all(x >= y for x, y in zip(per_pos, prev[3]))
        assert accepted <= drafted <= K * drafts
        assert sum(per_pos) == accepted and all(p <= drafts for p in per_pos)
        # one queue-time observation per request, whatever its n
        assert values[("deepinfer:request_queue_time_seconds_count", None)] == num_requests
        assert values[("deepinfer:request_queue_time_seconds_sum", None)] >= 0
        prev = now
    assert prev[0] > 0, "the n-gram speculator verified no drafts on a repetitive prompt"
