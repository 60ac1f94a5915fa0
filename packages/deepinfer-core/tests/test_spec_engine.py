"""Speculative decoding through the engine on the toy model: greedy output equals no speculation
(alone, batched, preempted, n > 1, stops inside an accepted run, logprobs), seeded sampling does not
depend on the batch, counters and errors."""

from __future__ import annotations

import re
from typing import ClassVar

import pytest
import torch

from deepinfer.engine.scheduler import DRAFT
from deepinfer.sampling import SamplingParams
from deepinfer.sampling.sampler import SampleRow
from deepinfer.speculators import SpeculatorError, registry
from deepinfer.speculators.interface import Proposal, ProposeBatch, SpeculatorConfig
from deepinfer.speculators.verify import sample_drafts

K = 3
ToyLM = None  # the conftest's toy model class, set per test


def toy_greedy(model, context: list[int], n: int) -> list[int]:
    """The toy model's argmax continuation of `context` (its logits are a function of the prefix)."""
    h, out = 0, []
    for pos, tok in enumerate(context):
        h = model._mix(h, tok, pos)
    for pos in range(len(context), len(context) + n):
        tok = int(model.table[h % model.table.shape[0]].argmax())
        out.append(tok)
        h = model._mix(h, tok, pos)
    return out


class OracleProposer:
    """Deterministic drafts: the toy model's greedy continuation, wrong at every third position, so
    steps accept some drafts and reject others."""

    model = None

    def __init__(self, num_draft_tokens: int):
        self.num_draft_tokens = num_draft_tokens
        self.released: list[int] = []

    @classmethod
    def build(cls, model, config: SpeculatorConfig) -> OracleProposer:
        cls.model = model
        return cls(config.num_draft_tokens or K)

    def propose(self, batch: ProposeBatch) -> Proposal:
        rows = []
        for r in batch.requests:
            drafts = toy_greedy(self.model, list(r.token_ids), r.num_drafts)
            rows.append([(t + 1) % 300 if (r.position + 1 + j) % 3 == 0 else t for j, t in enumerate(drafts)])
        width = max(len(d) for d in rows)
        ids = torch.tensor([d + [0] * (width - len(d)) for d in rows])
        return Proposal(ids, [len(d) for d in rows], confidences=torch.full(ids.shape, 0.5))

    def release(self, seq_id: int) -> None:
        self.released.append(seq_id)


DRAFT_PARAMS = SamplingParams(temperature=3.0)


class NoisyProposer(OracleProposer):
    """Drafts drawn from a flattened version of the toy model's next-token distribution, whatever the
    request's settings (probabilities handed to verification), on the draft stream of its seed."""

    def propose(self, batch: ProposeBatch) -> Proposal:
        tokens, probs = [], []
        for r in batch.requests:
            context, ts, ps = list(r.token_ids), [], []
            for j in range(r.num_drafts):
                h = 0
                for pos, tok in enumerate(context):
                    h = self.model._mix(h, tok, pos)
                logits = self.model.table[h % self.model.table.shape[0]]
                row = SampleRow(DRAFT_PARAMS, r.seed, r.position + 1 + j, 99)
                t, p = sample_drafts(logits[None], [row], None)
                ts.append(int(t))
                ps.append(p[0])
                context.append(int(t))
            tokens.append(ts)
            probs.append(ps)
        width = max(len(t) for t in tokens)
        pad = torch.zeros_like(probs[0][0])
        return Proposal(torch.tensor([t + [0] * (width - len(t)) for t in tokens]), [len(t) for t in tokens],
                        torch.stack([torch.stack(p + [pad] * (width - len(p))) for p in probs]))


class ScriptProposer(OracleProposer):
    """Drafts a known continuation (`script`: prompt -> output tokens), e.g. a plain run's output, so
    that every draft is accepted up to where the script ends."""

    script: ClassVar[dict[tuple[int, ...], list[int]]] = {}

    def propose(self, batch: ProposeBatch) -> Proposal:
        rows = []
        for r in batch.requests:
            history = list(r.token_ids)
            prompt, out = next((list(p), o) for p, o in self.script.items() if history[:len(p)] == list(p))
            done = len(history) - len(prompt)
            rows.append(out[done:done + r.num_drafts])
        width = max(1, *(len(d) for d in rows))
        ids = torch.tensor([d + [0] * (width - len(d)) for d in rows])
        return Proposal(ids, [len(d) for d in rows])


@pytest.fixture
def speculators(monkeypatch):
    found = {"oracle": OracleProposer, "noisy": NoisyProposer, "script": ScriptProposer}
    monkeypatch.setattr(registry, "available_speculators", lambda: found)
    return found


def prompts(k: int) -> list[list[int]]:
    return [[3 + (7 * i + j) % 300 for j in range(3 + 5 * i % 17)] for i in range(k)]


GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(autouse=True)
def _toy_class(toy_models):
    global ToyLM
    ToyLM = toy_models[0]


def toy():
    model = ToyLM()
    model.max_backtrack = K  # the toy rolls back any depth
    return model


def run(make_engine, drain, reqs, **config):
    engine = make_engine(model=toy(), **config)
    for i, (ids, params) in enumerate(reqs):
        engine.add_request(ids, params, request_id=f"r{i}")
    return drain(engine), engine


def tokens(outs) -> dict[str, list[list[int]]]:
    return {rid: [c.token_ids for c in o.outputs] for rid, o in outs.items()}


ASYNC = pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])


@pytest.mark.usefixtures("speculators")
@pytest.mark.parametrize("speculator", ["oracle", "noisy"])
@ASYNC
def test_greedy_equals_no_speculation_batched_and_alone(make_engine, drain, speculator, async_scheduling):
    reqs = [(p, GREEDY) for p in prompts(6)]
    reqs.append((list(range(5, 75)), GREEDY))  # prefilled in chunks of the 32-token budget, beside decodes
    # penalties and min_tokens: each verification row sees the drafts before it as generated tokens
    reqs.append((prompts(8)[7], SamplingParams(temperature=0, max_tokens=24, repetition_penalty=1.5,
                                               presence_penalty=1.0, frequency_penalty=0.5, min_tokens=10)))
    plain, _ = run(make_engine, drain, reqs)
    spec, engine = run(make_engine, drain, reqs, speculator=speculator, num_draft_tokens=K,
                       async_scheduling=async_scheduling)
    assert tokens(spec) == tokens(plain)
    stats = engine.stats
    assert 0 < stats.spec_accepted_tokens < stats.spec_draft_tokens  # some drafts accepted, some rejected
    assert max(s.num_tokens for s in stats.steps) > len(reqs)  # verification segments really ran
    assert engine.model.device_id_batches > 0  # draft ids reached the forward from the proposal tensor
    out = spec["r2"].outputs[0]
    assert out.draft_tok > out.accept_tok > 0
    assert (out.confidence is not None) == (speculator == "oracle")  # only the oracle estimates
    alone, _ = run(make_engine, drain, reqs[2:3], speculator=speculator, num_draft_tokens=K)
    assert tokens(alone)["r0"] == tokens(plain)["r2"]


@pytest.mark.parametrize("schedule", ["fixed", "confidence"])
@ASYNC
def test_preemption_n_and_stops_match_no_speculation(make_engine, drain, speculators, async_scheduling,
                                                     schedule):
    long = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    reqs = [(p, long) for p in prompts(8)]
    reqs.append((prompts(9)[8], SamplingParams(temperature=0, max_tokens=20, n=3, ignore_eos=True)))
    # a stop token and max_tokens that fall inside accepted runs
    first = toy_greedy(toy(), prompts(10)[9], 12)
    reqs.append((prompts(10)[9], SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[first[7]],
                                                 ignore_eos=True, logprobs=2)))
    reqs.append((prompts(11)[10], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)))
    plain, _ = run(make_engine, drain, reqs)
    tight = dict(cache_bytes=24 * 32 + 12 * 64 + 32)
    spec, engine = run(make_engine, drain, reqs, speculator="oracle", num_draft_tokens=K,
                       async_scheduling=async_scheduling, spec_schedule=schedule, **tight)
    assert engine.scheduler.num_preemptions > 0
    assert tokens(spec) == tokens(plain)
    stopped, ref = spec["r9"].outputs[0], plain["r9"].outputs[0]
    assert (stopped.finish_reason, stopped.stop_reason) == ("stop", first[7])
    assert [lp.logprob for lp in stopped.logprobs] == [lp.logprob for lp in ref.logprobs]
    assert len(spec["r10"].outputs[0].token_ids) == 5
    # every sequence released once when it finished (8 + 3 completions + 2)
    assert len(engine.proposer.released) == len(set(engine.proposer.released)) == 8 + 3 + 2


def test_seeded_sampling_is_independent_of_the_batch(make_engine, drain, speculators):
    reqs = [(p, SamplingParams(temperature=0.8, top_k=50, seed=100 + i, max_tokens=20, ignore_eos=True))
            for i, p in enumerate(prompts(6))]
    batched, engine = run(make_engine, drain, reqs, speculator="noisy", num_draft_tokens=K)
    assert engine.stats.spec_accepted_tokens > 0
    for i in (0, 3, 5):
        alone, _ = run(make_engine, drain, reqs[i:i + 1], speculator="noisy", num_draft_tokens=K)
        assert tokens(alone)["r0"] == tokens(batched)[f"r{i}"]


def test_abort_mid_speculation_frees_everything(make_engine, drain, speculators):
    engine = make_engine(model=toy(), speculator="oracle", num_draft_tokens=K)
    for i, p in enumerate(prompts(3)):
        engine.add_request(p, GREEDY, request_id=f"r{i}")
    for _ in range(4):
        engine.step()
    engine.abort("r1")
    outs = drain(engine)
    assert outs["r1"].outputs[0].finish_reason == "abort"
    assert len(outs["r0"].outputs[0].token_ids) == 24


def test_bad_speculator_settings_are_named(make_engine, speculators):
    listed = r"'medusa' is not installed \(installed: \['noisy', 'oracle', 'script'\]\)"
    with pytest.raises(SpeculatorError, match=listed):
        make_engine(model=toy(), speculator="medusa")
    with pytest.raises(SpeculatorError, match="roll back only 3 tokens"):
        make_engine(model=toy(), speculator="oracle", num_draft_tokens=4)


@ASYNC
def test_confidence_schedule_keeps_greedy_output(make_engine, drain, speculators, async_scheduling):
    pytest.importorskip("deepinfer_spec.confidence")
    reqs = [(p, GREEDY) for p in prompts(5)]
    plain, _ = run(make_engine, drain, reqs)
    spec, engine = run(make_engine, drain, reqs, speculator="oracle", num_draft_tokens=K,
                       spec_schedule="confidence", async_scheduling=async_scheduling)
    assert tokens(spec) == tokens(plain)
    assert engine.scheduler.verify_scheduler.curve is not None  # profiled at start-up


class VaryingProposer(OracleProposer):
    """The oracle's drafts with confidences that vary by position (so that the newest estimates rank
    the drafts differently from the ones before)."""

    def propose(self, batch: ProposeBatch) -> Proposal:
        proposal = super().propose(batch)
        rows = [[0.15 + 0.8 * ((r.position * 7 + j * 3) % 5) / 4 for j in range(proposal.token_ids.shape[1])]
                for r in batch.requests]
        return Proposal(proposal.token_ids, proposal.num_drafts, confidences=torch.tensor(rows))


def test_async_confidence_schedule_plans_without_waiting_for_the_drafts(make_engine, drain, speculators,
                                                                        monkeypatch):
    """Under async scheduling the planner never reads the drafts in flight (their confidences): it
    chooses each sequence's drafts from the estimates of the drafts it had before."""
    pytest.importorskip("deepinfer_spec.confidence")
    from deepinfer.engine.scheduler import Scheduler
    from deepinfer.speculators.drafts import ProposedDrafts
    from deepinfer_spec.latency import LatencyCurve

    monkeypatch.setitem(speculators, "varying", VaryingProposer)
    planning, waited, choices = [False], [], []
    schedule, host = Scheduler.schedule, ProposedDrafts.host

    def spied_schedule(self):
        planning[0] = True
        try:
            return schedule(self)
        finally:
            planning[0] = False

    def spied_host(self):
        waited.append(planning[0] and self._host is None)  # a copy still in flight, read to plan
        return host(self)

    monkeypatch.setattr(Scheduler, "schedule", spied_schedule)
    monkeypatch.setattr(ProposedDrafts, "host", spied_host)
    reqs = [(p, GREEDY) for p in prompts(5)]
    plain, _ = run(make_engine, drain, reqs)
    engine = make_engine(model=toy(), speculator="varying", num_draft_tokens=K, spec_schedule="confidence")
    timing = engine.scheduler.verify_scheduler
    # a latency curve where a draft is worth verifying only if its estimate is high: a real choice
    timing.curve = LatencyCurve([1, 32], [2.0, 2.0 + 31 * 0.25])
    monkeypatch.setattr(timing, "record", lambda *a: None)
    choose = timing.choose
    monkeypatch.setattr(timing, "choose", lambda rows: choices.extend(zip(rows, c := choose(rows))) or c)
    for i, (ids, params) in enumerate(reqs):
        engine.add_request(ids, params, request_id=f"r{i}")
    assert tokens(drain(engine)) == tokens(plain)
    assert waited and not any(waited)
    assert any(0 < k < len(row) for row, k in choices)  # some drafts of a sequence left out, some verified
    assert 0 < engine.stats.spec_draft_tokens < sum(len(row) for row, _ in choices)


def test_async_confidence_split_charges_the_budget_with_the_rows_that_run(make_engine, drain, speculators,
                                                                          monkeypatch):
    """Every draft is planned (an upper bound) but the token budget is charged with the host's total: a
    budget smaller than the planned rows still schedules every running sequence and admits prompts, and
    no step runs more rows than the budget."""
    pytest.importorskip("deepinfer_spec.confidence")
    from deepinfer_spec.latency import LatencyCurve

    monkeypatch.setitem(speculators, "varying", VaryingProposer)
    reqs = [(p, GREEDY) for p in prompts(8)]
    plain, _ = run(make_engine, drain, reqs)
    budget = 12
    engine = make_engine(model=toy(), speculator="varying", num_draft_tokens=K, spec_schedule="confidence",
                         max_num_batched_tokens=budget)
    timing = engine.scheduler.verify_scheduler
    timing.curve = LatencyCurve([1, 32], [2.0, 2.0 + 31 * 0.25])  # drafts worth verifying only when likely
    monkeypatch.setattr(timing, "record", lambda *a: None)
    schedule, steps = engine.scheduler.schedule, []

    def planned():  # (rows planned, rows charged, running sequences left out) of each step
        running = [s for s in engine.scheduler.running if not s.num_inflight]
        out = schedule()
        split = out.split.host if out.split is not None else {}
        charged = sum(len(s.token_ids) - s.num_drafts + split.get(i, s.num_drafts)
                      for i, s in enumerate(out.segments))
        scheduled = {s.seq.seq_id for s in out.segments}
        steps.append((out.num_tokens, charged, sum(s.seq_id not in scheduled for s in running)))
        return out

    monkeypatch.setattr(engine.scheduler, "schedule", planned)
    for i, (ids, params) in enumerate(reqs):
        engine.add_request(ids, params, request_id=f"r{i}")
    assert tokens(drain(engine)) == tokens(plain)
    assert all(charged <= budget for _, charged, _ in steps)
    assert any(rows > budget for rows, _, _ in steps)  # the upper bounds alone would not fit
    assert not any(left_out for _, charged, left_out in steps if charged < budget)


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "alone"])
def test_async_confidence_split_runs_only_the_drafts_it_verifies(make_engine, drain, speculators, monkeypatch,
                                                                 batched):
    """Under async scheduling the step is planned with every draft and the host's total; the runner
    splits that total by the newest confidences on the device and the forward computes only those rows
    (the toy reads them back), not every planned draft; steps with a prefill chunk beside the decodes,
    or with one speculating sequence (nothing to choose), take the host's split. Greedy output stays that
    of no speculation."""
    pytest.importorskip("deepinfer_spec.confidence")
    from deepinfer_spec.latency import LatencyCurve

    monkeypatch.setitem(speculators, "varying", VaryingProposer)
    reqs = [(p, GREEDY) for p in prompts(5)] if batched else [(prompts(3)[2], GREEDY)]
    if batched:
        reqs.append((list(range(5, 75)), GREEDY))  # prefilled in chunks of 32 tokens, beside decodes
    plain, _ = run(make_engine, drain, reqs)
    engine = make_engine(model=toy(), speculator="varying", num_draft_tokens=K, spec_schedule="confidence")
    timing = engine.scheduler.verify_scheduler
    timing.curve = LatencyCurve([1, 32], [2.0, 2.0 + 31 * 0.25])  # drafts worth verifying only when likely
    monkeypatch.setattr(timing, "record", lambda *a: None)
    split, splits, choices = engine.runner.splitter, [], []
    engine.runner.splitter = lambda c, m, n: splits.append((m.clone(), n, kept := split(c, m, n))) or kept
    schedule = engine.scheduler.schedule

    def planned():  # each step's (drafts to verify, drafts planned) where a split is due
        out = schedule()
        if out.split is not None:
            choices.append((out.split.num_drafts, sum(out.segments[i].num_drafts for i in out.split.host)))
        return out

    monkeypatch.setattr(engine.scheduler, "schedule", planned)
    assert engine.model.split_rows  # the start-up profile timed split steps: their forward
    engine.model.split_rows.clear()
    for i, (ids, params) in enumerate(reqs):
        engine.add_request(ids, params, request_id=f"r{i}")
    assert tokens(drain(engine)) == tokens(plain)
    rows = engine.model.split_rows  # (rows computed, rows planned, per sequence) of each device-split step
    if not batched:  # one speculating sequence: the host's split is the only one, no device split
        assert any(0 < n < most for n, most in choices) and not splits and not rows
        return
    assert len(rows) == len(splits) > 0
    assert any(computed < planned for computed, planned, _ in rows)
    for (most, n, kept), (computed, planned, per_seq) in zip(splits, rows, strict=True):
        assert int(kept.sum()) == n and bool((kept <= most).all())  # the host's total, within the drafts
        assert planned - computed == int(most.sum()) - n  # the rows left out are the drafts left out
        assert per_seq == [1 + k for k in kept.tolist()]  # each sequence runs its own share


def test_structured_output_verifies_against_the_masked_target(make_engine, drain, speculators,
                                                               synthetic_tokenizer):
    regex = r"(\d{3}-\d{4}|[a-z]{2,6}@[a-z]{2,5}\.(com|org))"
    reqs = {f"r{i}": ([0, 5 + i, 6, 7], SamplingParams(temperature=0, max_tokens=60,
                                                       structured_outputs={"regex": regex}))
            for i in range(4)}
    reqs["free"] = ([0, 40, 41], GREEDY)
    outs = []
    for config in ({}, {"speculator": "oracle", "num_draft_tokens": K}):
        model = ToyLM(vocab_size=synthetic_tokenizer.vocab_size)
        model.max_backtrack = K
        engine = make_engine(model=model, tokenizer=synthetic_tokenizer, max_model_len=128, **config)
        for rid, (prompt, params) in reqs.items():
            engine.add_request(prompt, params, request_id=rid)
        outs.append({rid: o.outputs[0] for rid, o in drain(engine).items()})
    plain, spec = outs
    assert {r: o.token_ids for r, o in spec.items()} == {r: o.token_ids for r, o in plain.items()}
    assert all(re.fullmatch(regex, spec[f"r{i}"].text) for i in range(4))
    assert sum(spec[f"r{i}"].accept_tok for i in range(4)) > 0  # constrained rows verified drafts too


@pytest.mark.slow
def test_sampled_outputs_through_the_engine_follow_the_target(make_engine, drain, speculators):
    """Many seeds of one prompt: each generated position's marginal matches the toy model's exact one
    (chi-square), with drafts from a deliberately flattened distribution verified by the engine."""
    vocab, n, prompt = 6, 3000, [3, 4, 5]
    model = ToyLM(vocab_size=vocab)
    model.max_backtrack = K
    engine = make_engine(model=model, speculator="noisy", num_draft_tokens=K, max_num_seqs=256,
                         max_num_batched_tokens=1024)
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=4, ignore_eos=True) for i in range(n)]
    for i, p in enumerate(params):
        engine.add_request(prompt, p, request_id=f"r{i}")
    outs = [o.outputs[0].token_ids for o in drain(engine).values()]
    stats = engine.stats
    assert 0 < stats.spec_accepted_tokens < stats.spec_draft_tokens

    def exact(depth: int, temperature: float = 1.0) -> torch.Tensor:
        """Marginal of the token at prompt + depth, summing over every path before it."""
        paths = {(): 1.0}
        for _ in range(depth + 1):
            nxt: dict[tuple[int, ...], float] = {}
            for path, mass in paths.items():
                h = 0
                for pos, tok in enumerate(prompt + list(path)):
                    h = model._mix(h, tok, pos)
                q = torch.softmax(model.table[h % model.table.shape[0]].double() / temperature, -1)
                for t in range(vocab):
                    nxt[(*path, t)] = mass * q[t].item()
            paths = nxt
        marginal = torch.zeros(vocab, dtype=torch.float64)
        for path, mass in paths.items():
            marginal[path[-1]] += mass
        return marginal

    def chi2(depth: int, expected: torch.Tensor) -> float:
        counts = torch.bincount(torch.tensor([o[depth] for o in outs]), minlength=vocab).double()
        keep = expected * n > 5
        return float(((counts[keep] - n * expected[keep]) ** 2 / (n * expected[keep])).sum())

    for depth in (1, 2, 3):
        assert chi2(depth, exact(depth)) < 25.7  # p = 1e-4 at 5 degrees of freedom
    assert chi2(2, exact(2, temperature=3.0)) > 100  # the drafts' own law is told apart


class DeadEndBackend:
    """The real grammar backend, except that nothing is allowed once a matcher has consumed `after`
    tokens (counted through its rollbacks): a dead end in the middle of the output."""

    after = 3

    def __init__(self, real):
        self.real, self.vocab_size, self.encode = real, real.vocab_size, real.encode

    def compile(self, spec):
        return CountingMatcher(self.real.compile(spec))

    def fill(self, rows, bitmask):
        self.real.fill([(m.m, i) for m, i in rows], bitmask)
        for m, i in rows:
            if m.consumed >= self.after:
                bitmask[i] = 0


class CountingMatcher:
    def __init__(self, m, consumed: int = 0):
        self.m, self.consumed = m, consumed

    def accept(self, token):
        self.consumed += 1
        return self.m.accept(token)

    def fork(self):
        return CountingMatcher(self.m.fork(), self.consumed)

    def rollback(self, n):
        self.consumed -= n
        self.m.rollback(n)

    def error(self):
        return self.m.error()


@ASYNC
def test_grammar_dead_end_after_accepted_drafts_is_a_grammar_error(make_engine, drain, speculators,
                                                                   synthetic_tokenizer, async_scheduling):
    """The dead end falls on a row after accepted drafts (the drafts replay a plain run's output):
    the sequence ends there with "grammar_error", as without speculation."""
    from deepinfer.structured.llguidance_backend import LLGuidanceBackend

    prompt, params = [0, 5, 6, 7], SamplingParams(temperature=0, max_tokens=60,
                                                 structured_outputs={"regex": "[a-z]{20}"})
    outs = []
    for config in ({}, {"speculator": "script", "num_draft_tokens": K}):
        model = ToyLM(vocab_size=synthetic_tokenizer.vocab_size)
        model.max_backtrack = K
        engine = make_engine(model=model, tokenizer=synthetic_tokenizer, max_model_len=128,
                             async_scheduling=async_scheduling, **config)
        engine.runner.structured._factory = lambda tok, v, eos: DeadEndBackend(LLGuidanceBackend(tok, v, eos))
        engine.add_request(prompt, params, request_id="d")
        outs.append(drain(engine)["d"].outputs[0])
        ScriptProposer.script = {tuple(prompt): outs[0].token_ids}
    plain, spec = outs
    assert (plain.finish_reason, len(plain.token_ids)) == ("grammar_error", DeadEndBackend.after + 1)
    assert (spec.finish_reason, spec.token_ids) == (plain.finish_reason, plain.token_ids)
    assert spec.accept_tok >= 2  # the dead-end row came after accepted drafts


def test_async_speculation_matches_sync_with_stop_strings_and_streams(make_engine, drain, speculators,
                                                                     synthetic_tokenizer):
    """Async speculative steps (step N's text-level work runs while step N+1 computes) give the same
    outputs as sync steps and as no speculation: a stop string inside an accepted run ends the
    sequence there, streamed deltas add up to the final text."""
    def engine_for(**config):
        model = ToyLM(vocab_size=synthetic_tokenizer.vocab_size)
        model.max_backtrack = K
        return make_engine(model=model, tokenizer=synthetic_tokenizer, max_model_len=128, **config)

    prompts_ = [[0, 5 + i, 6, 7 + i] for i in range(4)]
    free = drain(_added(engine_for(), [(p, GREEDY) for p in prompts_]))
    texts = [free[f"r{i}"].outputs[0].text for i in range(4)]
    assert all(len(t) > 12 for t in texts)
    reqs = [(p, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[texts[i][8:11]],
                               logprobs=1)) for i, p in enumerate(prompts_)]
    reqs.append((prompts_[0], GREEDY))
    results = []
    for config in ({}, {"async_scheduling": False}, {}):
        if len(results):
            config |= {"speculator": "oracle", "num_draft_tokens": K}
        engine = _added(engine_for(**config), reqs, stream=True)
        streamed: dict[str, tuple] = {}
        overlapped = 0
        while engine.has_unfinished_requests():
            for o in engine.step():
                c = o.outputs[0]
                text, ids, lps, _ = streamed.get(o.request_id, ("", [], [], None))
                streamed[o.request_id] = (text + c.text, ids + c.token_ids,
                                          lps + [lp.logprob for lp in c.logprobs or []], c.finish_reason)
            overlapped += bool(engine._inflight)  # a step left running while this one's outputs came
        results.append((streamed, engine.stats.spec_accepted_tokens, overlapped))
    (plain, _, _), (sync, sync_accepted, sync_overlapped), (async_, async_accepted, overlapped) = results
    assert plain == sync == async_
    assert sync_accepted == async_accepted > 0
    assert sync_overlapped == 0 < overlapped
    for i in range(4):
        text, _, _, reason = plain[f"r{i}"]
        assert reason == "stop" and texts[i].startswith(text) and len(text) < 11


def _added(engine, reqs, stream: bool = False):
    for i, (ids, params) in enumerate(reqs):
        engine.add_request(ids, params, request_id=f"r{i}", stream=stream)
    return engine


def test_drafts_made_off_the_model_device_reach_it_in_the_lists(make_engine, drain, speculators):
    # A host lookup's drafts are written into the segment lists, not gathered on the model's device.
    class ElsewhereToyLM(ToyLM):
        device = torch.device("meta")  # the oracle's drafts are CPU tensors: not on this device

    model = ElsewhereToyLM()
    model.max_backtrack = K
    reqs = [(p, GREEDY) for p in prompts(4)]
    plain, _ = run(make_engine, drain, reqs)
    engine = make_engine(model=model, speculator="oracle", num_draft_tokens=K)
    for i, (ids, params) in enumerate(reqs):
        engine.add_request(ids, params, request_id=f"r{i}")
    assert tokens(drain(engine)) == tokens(plain)
    assert engine.stats.spec_accepted_tokens > 0 and model.device_id_batches == 0


class SlowCudaProposer(OracleProposer):
    """The oracle's drafts and confidences produced on the GPU behind a long device-side spin."""

    spin_cycles = 400_000_000  # ~200 ms at H200 clocks
    spun: torch.cuda.Event | None = None  # recorded after the latest spin

    def propose(self, batch: ProposeBatch) -> Proposal:
        host = super().propose(batch)
        ids, confidences = host.token_ids.cuda(), host.confidences.cuda()
        # launched before the spin as well: a kernel's first launch loads it (lazy module loading), and
        # the load synchronised behind a running spin on the H200 (call B probe, 2026-12-02)
        ids + 0, confidences * 1.0
        torch.cuda._sleep(self.spin_cycles)
        SlowCudaProposer.spun = torch.cuda.Event()
        SlowCudaProposer.spun.record()
        # outputs of kernels queued behind the spin: valid on the host only once it has ended
        return Proposal(ids + 0, host.num_drafts, confidences=confidences * 1.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("schedule", ["fixed", "confidence"])
def test_the_next_step_starts_while_its_drafts_are_still_drafted(make_engine, drain, speculators, schedule):
    # Planned from the draft counts (and, under a confidence schedule, from the estimates of the drafts
    # before), a verifying step reaches the model while the drafting before it still runs on the
    # device; its forward takes the draft ids from there.
    speculators["slow_cuda"] = SlowCudaProposer
    entered: list[bool] = []  # per verifying forward: was the drafting before it still running?

    class CudaToyLM(ToyLM):
        device = torch.device("cuda")
        splitting = False

        def forward(self, batch):
            if not self.splitting and any(t == DRAFT for seg in batch.segments for t in seg.token_ids):
                entered.append(not SlowCudaProposer.spun.query())
            return super().forward(batch)

        def forward_rows(self, batch, rows, total):
            # a device-split step is entered here; the toy then reads the row counts (waits for them)
            if any(t == DRAFT for seg in batch.segments for t in seg.token_ids):
                entered.append(not SlowCudaProposer.spun.query())
            self.splitting = True
            try:
                return super().forward_rows(batch, rows, total)
            finally:
                self.splitting = False

    model = CudaToyLM()
    model.max_backtrack = K
    reqs = [(p, GREEDY) for p in prompts(3)]
    plain, _ = run(make_engine, drain, reqs)
    engine = make_engine(model=model, speculator="slow_cuda", num_draft_tokens=K, spec_schedule=schedule)
    for i, (ids, params) in enumerate(reqs):
        engine.add_request(ids, params, request_id=f"r{i}")
    assert tokens(drain(engine)) == tokens(plain)
    # the first one too (the H200 showed [False, True, True, ...] while this proposer's own first kernel
    # launches after the spin waited for it, 2026-12-02 calls G1 and B)
    assert len(entered) > 2 and all(entered), entered


def test_history_view_reads_like_the_joined_list():
    from deepinfer.speculators.interface import History

    base, tail = [3, 4, 5, 6], [7, 8]
    view, joined = History(base, tail), base + tail
    assert len(view) == 6 and list(view) == joined
    for i in range(-6, 6):
        assert view[i] == joined[i]
    for s in (slice(None), slice(2, None), slice(4, None), slice(5, 6), slice(1, 5), slice(-3, None),
              slice(0, 0), slice(7, None), slice(None, None, 2)):
        assert view[s] == joined[s], s
    with pytest.raises(IndexError, match="history index 6 out of range"):
        view[6]


class FailingProposer(OracleProposer):
    """Fails on its `fail_at`-th call (a step's drafting raises on the worker)."""

    fail_at = 3

    def __init__(self, num_draft_tokens: int):
        super().__init__(num_draft_tokens)
        self.calls = 0

    def propose(self, batch: ProposeBatch) -> Proposal:
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("drafting failed")
        return super().propose(batch)


@ASYNC
def test_a_failed_speculative_step_errors_its_sequences_and_the_engine_serves_on(
        make_engine, drain, speculators, monkeypatch, async_scheduling):
    monkeypatch.setitem(speculators, "failing", FailingProposer)
    engine = make_engine(model=toy(), speculator="failing", num_draft_tokens=K,
                         async_scheduling=async_scheduling)
    for i, p in enumerate(prompts(3)):
        engine.add_request(p, GREEDY, request_id=f"r{i}")
    done = {}
    with pytest.raises(RuntimeError, match="drafting failed"):
        for _ in range(20):
            done |= {o.request_id: o for o in engine.step() if o.finished}
    done |= drain(engine)
    assert {o.outputs[0].finish_reason for o in done.values()} == {"error"}
    engine.add_request(prompts(1)[0], GREEDY, request_id="after")
    plain, _ = run(make_engine, drain, [(prompts(1)[0], GREEDY)])
    assert drain(engine)["after"].outputs[0].token_ids == tokens(plain)["r0"][0]
