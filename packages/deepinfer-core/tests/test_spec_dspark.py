"""Speculative decoding on the real runtime (tiny random config with DSpark blocks): greedy output with
the DSpark proposer and with a partly right proposer equals no speculation; after rejections every
live cache entry and state equals a no-speculation run's; the DSpark proposer's drafts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import pytest
import torch

from deepinfer.cache import BLOCK_TOKENS
from deepinfer.entrypoints.llm import LLM, SettingError
from deepinfer.models.deepseek_v41.runtime import DeepseekV41Runtime, RuntimeOptions, load_runtime
from deepinfer.models.interface import ForwardBatch, SequenceSegment
from deepinfer.sampling import SamplingParams
from deepinfer.speculators import registry
from deepinfer.speculators.interface import Proposal, ProposeBatch, ProposeRequest, SpeculatorConfig
from deepinfer.testing import write_tiny_checkpoint

dspark_mod = pytest.importorskip("deepinfer_spec.dspark")
ngram_mod = pytest.importorskip("deepinfer_spec.ngram")

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint("dspark", tmp_path_factory.mktemp("spec"), seed=3)


def prompts(k: int, vocab: int = 700) -> list[list[int]]:
    return [[5 + (13 * i + 7 * j) % vocab for j in range(9 + 4 * i)] for i in range(k)]


class ReferenceProposer:
    """Drafts the known greedy continuation of each prompt, wrong at every third position."""

    reference: ClassVar[dict[tuple[int, ...], list[int]]] = {}

    def __init__(self, k: int):
        self.num_draft_tokens = k

    @classmethod
    def build(cls, model, config: SpeculatorConfig) -> ReferenceProposer:
        return cls(config.num_draft_tokens or 3)

    def propose(self, batch: ProposeBatch) -> Proposal:
        rows = []
        for r in batch.requests:
            prompt = next(p for p in self.reference if tuple(r.token_ids[:len(p)]) == p)
            ref = self.reference[prompt][len(r.token_ids) - len(prompt):][:r.num_drafts]
            rows.append([t + 1 if (r.position + 1 + j) % 3 == 0 else t for j, t in enumerate(ref)])
        width = max(1, *(len(d) for d in rows))
        ids = torch.tensor([d + [0] * (width - len(d)) for d in rows])
        return Proposal(ids, [len(d) for d in rows])

    def release(self, seq_id: int) -> None:
        pass


@pytest.fixture
def speculators(monkeypatch):
    found = {"dspark": dspark_mod.DSparkProposer, "ngram": ngram_mod.NgramProposer,
             "reference": ReferenceProposer}
    monkeypatch.setattr(registry, "available_speculators", lambda: found)


@pytest.fixture
def fixed_latency(monkeypatch):
    """The confidence scheduler's latency curve fixed: no start-up timing, no refinement by measured steps.
    A draft is then worth verifying only when likely, so steps leave some drafts out (the device split's
    case) whatever this machine's load does to its timings (a timed curve made these tests flaky)."""
    confidence = pytest.importorskip("deepinfer_spec.confidence")
    from deepinfer_spec.latency import LatencyCurve

    def profile(self, time_step, max_tokens, **kwargs) -> None:
        self.curve = LatencyCurve([1, 32], [2.0, 2.0 + 31 * 0.25])

    monkeypatch.setattr(confidence.ConfidenceScheduler, "profile", profile)
    monkeypatch.setattr(confidence.ConfidenceScheduler, "record", lambda self, *args: None)


def generate(path: Path, reqs, **kwargs) -> tuple[list[list[list[int]]], LLM]:
    llm = LLM(path, max_model_len=96, max_num_seqs=4, log_stats_interval=0, **kwargs)
    outs = llm.generate(prompt_token_ids=[p for p, _ in reqs], sampling_params=[s for _, s in reqs])
    return [[c.token_ids for c in o.outputs] for o in outs], llm


@pytest.mark.usefixtures("speculators", "fixed_latency")
def test_greedy_speculation_equals_no_speculation(checkpoint: Path, monkeypatch) -> None:
    reqs = [(p, GREEDY) for p in prompts(3)]
    reqs.append((prompts(4)[3], SamplingParams(temperature=0, max_tokens=10, n=2, ignore_eos=True)))
    plain, _ = generate(checkpoint, reqs)
    # the confidence schedule under async scheduling: the total planned from the estimates of the drafts
    # before, split on the device by the newest ones, the step's metadata built there (forward_rows)
    split_steps, forward_rows = [], DeepseekV41Runtime.forward_rows

    def spied(rt: DeepseekV41Runtime, batch, rows: torch.Tensor, total: int) -> torch.Tensor:
        split_steps.append((total, sum(len(s.token_ids) for s in batch.segments)))
        return forward_rows(rt, batch, rows, total)

    monkeypatch.setattr(DeepseekV41Runtime, "forward_rows", spied)
    for name, schedule in (("dspark", "fixed"), ("ngram", "fixed"), ("dspark", "confidence"),
                           ("ngram", "confidence")):
        split_steps.clear()
        drafted, llm = generate(checkpoint, reqs, speculator=name, spec_schedule=schedule)
        assert drafted == plain, (name, schedule)
        assert llm.engine.stats.spec_draft_tokens > 0
        # serving steps split on the device only with a choice among several speculating sequences:
        # DSpark drafts for every sequence; prompt lookup only where its context repeats, which these
        # prompts need not give two sequences in one step
        if name == "dspark":
            assert bool(split_steps) == (schedule == "confidence"), schedule
    ReferenceProposer.reference = {tuple(p): out[0] for (p, _), out in zip(reqs, plain, strict=True)}
    referenced, llm = generate(checkpoint, reqs, speculator="reference", num_draft_tokens=3)
    assert referenced == plain
    stats = llm.engine.stats
    assert 0 < stats.spec_accepted_tokens < stats.spec_draft_tokens


@pytest.mark.usefixtures("speculators", "fixed_latency")
def test_async_confidence_split_steps_replay_graphs(checkpoint: Path, monkeypatch) -> None:
    """With graphs (the CPU stand-in recorder), the device-split steps of the async confidence schedule
    replay split graphs and greedy output stays that of no speculation."""
    from deepinfer.models.deepseek_v41.split_graphs import SplitGraphs
    from deepinfer.testing.engine import run_requests
    from deepinfer.testing.recorder import rerun_recorder

    reqs = [(p, GREEDY) for p in prompts(3)]
    config = {"max_model_len": 96, "max_num_seqs": 4}
    plain, _ = run_requests(load_runtime(checkpoint), reqs, **config)
    rt = load_runtime(checkpoint)
    rt.graph_recorder = rerun_recorder
    replays, forward = [], SplitGraphs.forward

    def counted(graphs: SplitGraphs, batch, rows: torch.Tensor, total: int) -> torch.Tensor | None:
        logits = forward(graphs, batch, rows, total)
        if logits is not None:  # a serving step replayed a graph
            replays.append(total)
        return logits

    monkeypatch.setattr(SplitGraphs, "forward", counted)
    drafted, engine = run_requests(rt, reqs, speculator="dspark", spec_schedule="confidence", **config)
    assert drafted == plain and engine.stats.spec_draft_tokens > 0
    assert replays


def live_state(rt: DeepseekV41Runtime, slot: int, blocks: list[int], length: int) -> dict[str, torch.Tensor]:
    """Every cache entry and state a forward at position `length` may read: window keys of the last W
    positions (backbone and DSpark blocks), compressor partial groups, compressed KV and index keys of
    the completed groups, the Engram id history."""
    cfg, cache, state = rt.cfg, rt.cache, {}
    w = cfg.sliding_window
    for spec in cfg.layers:
        ring = cache.window(spec.index)
        state[f"window.{spec.index}"] = torch.stack(
            [ring.data[slot, p % ring.length] for p in range(max(0, length - w), length)])
        if not spec.owns_compressor:
            continue
        r = spec.compress_ratio
        per_block = BLOCK_TOKENS // r
        for kind in ("kv", "index"):
            pool = cache.compressed_kv(spec.index) if kind == "kv" else cache.index_keys(spec.index)
            state[f"{kind}.{spec.index}"] = torch.stack(
                [pool.data[blocks[j // per_block], j % per_block] for j in range(length // r)])
        if r > 1 and length % r:
            comp = cache.compressor_state(spec.index)
            state[f"compressor.{spec.index}"] = torch.stack(
                [comp.data[slot, p % comp.length] for p in range(length // r * r, length)])
    if rt.history is not None:
        hl = rt.history_len
        state["engram"] = torch.stack([rt.history[slot, p % hl] for p in range(max(0, length - hl), length)])
    return state


def test_state_after_rejections_equals_no_speculation(checkpoint: Path) -> None:
    rt = load_runtime(checkpoint, options=RuntimeOptions(max_backtrack=5))
    rt.allocate_cache(3, 3)
    prompt = prompts(1)[0]
    n = len(prompt)
    truth = prompt + [(7 * i + 3) % 700 + 5 for i in range(18)]
    for slot in (1, 2):
        rt.reset_slot(slot)
        rt.forward(ForwardBatch([SequenceSegment(slot, [slot], 0, prompt, "last")]))
    # slot 1: one token at a time
    for p in range(n, len(truth)):
        rt.forward(ForwardBatch([SequenceSegment(1, [1], p, [truth[p]], "last")]))
    # slot 2: verification segments [token, drafts...] that accept `good` drafts, then restart after them
    pos = n
    for good, bad in [(1, 3), (0, 4), (2, 2), (4, 0), (0, 1), (1, 2)]:
        drafts = truth[pos + 1:pos + 1 + good] + [1 + t % 600 for t in range(pos, pos + bad)]
        rt.forward(ForwardBatch([SequenceSegment(2, [2], pos, [truth[pos], *drafts], "all")]))
        pos += good + 1
    rt.forward(ForwardBatch([SequenceSegment(2, [2], pos, truth[pos:], "all")]))
    a, b = live_state(rt, 1, [1], len(truth)), live_state(rt, 2, [2], len(truth))
    assert a.keys() == b.keys() and len(a) > 10
    for name in a:
        if name == "engram":
            assert torch.equal(a[name], b[name])
        else:  # raw float32 entries ("exact" cache); one-row and multi-row matmuls round differently
            torch.testing.assert_close(a[name].view(torch.float32), b[name].view(torch.float32),
                                       rtol=1e-4, atol=1e-5, msg=name)
    # and the drafts from that state are the same
    out = rt.dspark.draft(rt.cache, [1, 2], [len(truth)] * 2, [9, 9])
    torch.testing.assert_close(out.base_logits[0], out.base_logits[1], atol=1e-4, rtol=0)


def test_dspark_proposer_draws_from_its_distributions(checkpoint: Path) -> None:
    rt = load_runtime(checkpoint, options=RuntimeOptions(max_backtrack=5))
    rt.allocate_cache(3, 3)
    proposer = dspark_mod.DSparkProposer.build(rt, SpeculatorConfig(None))
    assert proposer.num_draft_tokens == rt.dspark.block_size
    ids = prompts(2)
    requests = []
    for slot, p in zip((1, 2), ids, strict=True):
        rt.reset_slot(slot)
        rt.forward(ForwardBatch([SequenceSegment(slot, [slot], 0, p[:-1], "none")]))
        params = SamplingParams(temperature=0.9, top_k=40, seed=slot)
        requests.append(ProposeRequest(slot, slot, len(p) - 1, p, params, 1000 + slot, 3 + slot - 1))
    sampled = torch.tensor([p[-1] for p in ids])
    both = proposer.propose(ProposeBatch(requests, sampled))
    assert both.num_drafts == [3, 4] and both.token_ids.shape == (2, 4)
    probs = both.probs
    assert probs is not None and probs.shape == (2, 4, rt.vocab_size)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 4))
    assert (probs.gather(2, both.token_ids[..., None]) > 0).all()
    assert ((probs > 0).sum(-1) <= 40).all()  # the request's top-k applies to drafts
    assert both.confidences is not None and ((both.confidences > 0) & (both.confidences < 1)).all()
    alone = proposer.propose(ProposeBatch(requests[1:], sampled[1:]))
    assert torch.equal(alone.token_ids[0], both.token_ids[1])  # keyed by seed and position only


def test_dspark_needs_draft_blocks(tmp_path: Path, speculators) -> None:
    path = write_tiny_checkpoint("swa_only", tmp_path, seed=1)
    with pytest.raises(SettingError, match="speculator: speculator 'dspark' needs a checkpoint with DSpark"):
        LLM(path, speculator="dspark", max_model_len=64)
    with pytest.raises(SettingError, match=r"'nope' is not installed \(installed: \['dspark', 'ngram', 're"):
        LLM(path, speculator="nope", max_model_len=64)


TRAINED = Path(__file__).resolve().parents[3] / "checkpoints" / "tiny-stdlib"


@pytest.mark.slow
@pytest.mark.skipif(not (TRAINED / "config.json").exists(), reason="the trained default model is not here")
@pytest.mark.usefixtures("speculators")
def test_trained_default_model_accepts_drafts_and_keeps_greedy_output() -> None:
    texts = ["def add(a, b):\n    return a + b\n\ndef sub(a, b):\n", "import os\nimport sys\nfor name in"]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outs = []
    for kwargs in ({}, {"speculator": "dspark"}):
        llm = LLM(TRAINED, max_model_len=256, max_num_seqs=2, log_stats_interval=0, **kwargs)
        outs.append([o.outputs[0].token_ids for o in llm.generate(texts, params, use_tqdm=False)])
    assert outs[0] == outs[1]
    assert llm.engine.stats.mean_accepted_length() > 1.5  # a trained drafter, unlike random weights


@pytest.mark.usefixtures("speculators")
def test_cli_generate_with_a_speculator(checkpoint: Path, capsys) -> None:
    from deepinfer.entrypoints.cli.main import main

    base = ["--log-level", "WARNING", "generate", "--model", str(checkpoint), "--max-model-len", "96",
            "--cache-mb", "16", "--temperature", "0", "--prompt-ids", "5,9,13,17,21", "--max-tokens", "8",
            "--ignore-eos", "--json"]
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out)["outputs"][0]
    assert main([*base, "--speculator", "dspark", "--num-draft-tokens", "2"]) == 0
    drafted = json.loads(capsys.readouterr().out)["outputs"][0]
    assert drafted["token_ids"] == plain["token_ids"] and drafted["draft_tok"] > 0 == plain["draft_tok"]
    assert main([*base, "--speculator", "medusa"]) == 2
    error = capsys.readouterr().err
    assert "--speculator: speculator 'medusa' is not installed (installed: ['dspark'" in error


def test_greedy_batches_draft_the_argmax_without_distributions(checkpoint: Path) -> None:
    """An all-greedy batch takes the argmax shortcut: the same drafts as the general path gives a
    greedy request beside a sampled one, and no distributions."""
    rt = load_runtime(checkpoint, options=RuntimeOptions(max_backtrack=5))
    rt.allocate_cache(3, 3)
    proposer = dspark_mod.DSparkProposer.build(rt, SpeculatorConfig(None))
    ids = prompts(2)
    kinds = [SamplingParams(temperature=0, logit_bias={7: 100.0}), SamplingParams(temperature=0.9, seed=2)]
    requests = []
    for slot, p, params in zip((1, 2), ids, kinds, strict=True):
        rt.reset_slot(slot)
        rt.forward(ForwardBatch([SequenceSegment(slot, [slot], 0, p[:-1], "none")]))
        requests.append(ProposeRequest(slot, slot, len(p) - 1, p, params, 1000 + slot, 4))
    sampled = torch.tensor([p[-1] for p in ids])
    mixed = proposer.propose(ProposeBatch(requests, sampled))
    greedy = proposer.propose(ProposeBatch(requests[:1], sampled[:1]))
    assert mixed.probs is not None and greedy.probs is None
    assert torch.equal(greedy.token_ids[0], mixed.token_ids[0])
    assert greedy.token_ids[0].tolist() == [7] * 4  # the request's logit bias applies to drafts
    torch.testing.assert_close(greedy.confidences[0], mixed.confidences[0])
