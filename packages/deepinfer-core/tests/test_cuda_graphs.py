"""CUDA graphs of decode / verification steps (models/deepseek_v41/graphs.py).

On the CPU a recorder that re-runs the recorded step stands in for a CUDA graph: it reads the same
persistent metadata and id buffers a graph would, so these tests check that a replay sees every input
of the step (metadata, device token ids) and that padding sequences leave the real ones alone. The GPU
tests replay real graphs: bitwise the eager logits when the batch is a bucket (same shapes), greedy
tokens of the eager cuda path and of the reference backend otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pydantic
import pytest
import torch

from deepinfer.cache import BLOCK_TOKENS
from deepinfer.engine import EngineConfig, LLMEngine
from deepinfer.models.deepseek_v41.graphs import DecodeGraphs, TritonCompilations
from deepinfer.models.deepseek_v41.metadata import FixedShape, StepMetadata
from deepinfer.models.deepseek_v41.runtime import DeepseekV41Runtime, RuntimeOptions, load_runtime
from deepinfer.models.interface import ForwardBatch, SequenceSegment
from deepinfer.sampling import SamplingParams
from deepinfer.sampling.sampler import SamplingGraphs
from deepinfer.testing import write_tiny_checkpoint
from deepinfer.testing.engine import run_requests
from deepinfer.testing.fields import fields_by_path
from deepinfer.testing.recorder import rerun_recorder

PREFILL = 9
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint("full", tmp_path_factory.mktemp("full"), seed=0)


def recording_runtime(
    checkpoint: Path, recorder: Callable | None = rerun_recorder, **kwargs: object
) -> DeepseekV41Runtime:
    """A CPU runtime whose caches get graphs recorded by `recorder` (by default the re-running stand-in)."""
    rt = load_runtime(checkpoint, **kwargs)
    rt.graph_recorder = recorder
    return rt


def _shapes(meta: StepMetadata) -> dict[str, object]:
    """Every tensor shape and host value of the metadata, by field path."""
    return fields_by_path(meta, lambda t: tuple(t.shape))


def test_fixed_shape_metadata_does_not_depend_on_the_batch(checkpoint: Path) -> None:
    rt = load_runtime(checkpoint)
    rt.allocate_cache(num_blocks=5, num_slots=4)
    fixed = FixedShape(num_seqs=4, tokens=1, table_width=2, logits="last")
    # odd end positions complete no ratio-2 group, even ones do; one or two sequences, one or two blocks
    one = ForwardBatch([SequenceSegment(2, [3], 6, [5])])
    two = ForwardBatch([SequenceSegment(1, [1, 2], BLOCK_TOKENS + 2, [5]), SequenceSegment(3, [4], 3, [6])])
    a = rt.builder.build(one, rt.last_is_consumer, fixed)
    b = rt.builder.build(two, rt.last_is_consumer, fixed)
    assert _shapes(a) == _shapes(b)
    assert a.num_rows == 4 and a.row_offsets == [0, 1, 2, 3, 4]
    assert a.slots.tolist() == [2, 0, 0, 0] and a.block_tables.tolist() == [[3, 0], [0, 0], [0, 0], [0, 0]]
    c2 = b.compression[2]  # one entry place per sequence; only the second sequence completes a group
    assert c2.capacity == 2 * BLOCK_TOKENS // 2 and c2.count == 4
    assert c2.pool_dest.tolist() == [0, 4 * (BLOCK_TOKENS // 2) + 1, 0, 0]
    assert c2.entry_positions.tolist() == [0, 2, 0, 0]
    with pytest.raises(ValueError, match="does not fit the fixed shape"):
        rt.builder.build(ForwardBatch([SequenceSegment(2, [3], 6, [5, 6])]), rt.last_is_consumer, fixed)
    with pytest.raises(ValueError, match="wider than 2"):
        rt.builder.build(ForwardBatch([SequenceSegment(2, [1, 2, 3], 6, [5])]), rt.last_is_consumer, fixed)


def test_metadata_tensors_are_16_byte_aligned(checkpoint: Path) -> None:
    """Triton specialises kernels on pointer alignment: misaligned metadata (arrays packed after an odd
    count) would compile new kernels per batch size, at every graph capture of a new bucket."""
    rt = load_runtime(checkpoint)
    rt.allocate_cache(num_blocks=5, num_slots=4)
    eager = ForwardBatch([SequenceSegment(1, [1], 0, [3, 4, 5]), SequenceSegment(2, [2], 4, [6])])
    metas = [rt.builder.build(eager, rt.last_is_consumer)]
    metas += [rt.builder.build(ForwardBatch([]), rt.last_is_consumer, FixedShape(b, n, w, "all"))
              for b, n, w in ((1, 1, 1), (3, 3, 2), (1, 5, 1))]
    for meta in metas:
        offsets = {k: v[1] for k, v in fields_by_path(meta, lambda t: ("tensor", t.data_ptr() % 16)).items()
                   if isinstance(v, tuple) and v[0] == "tensor"}
        assert len(offsets) > 10 and not any(offsets.values()), offsets


class Greedy:
    """Prefills sequences, then decodes greedily, optionally through the engine's device ids."""

    def __init__(self, rt: DeepseekV41Runtime, batch: int, blocks: int = 2) -> None:
        self.rt = rt
        rt.allocate_cache(num_blocks=batch * blocks + 1, num_slots=batch + 1)
        self.tables = {s: list(range(1 + (s - 1) * blocks, 1 + s * blocks)) for s in range(1, batch + 1)}
        prompts = {s: [3 + (7 * s + j) % 40 for j in range(PREFILL)] for s in self.tables}
        self.tokens = prompts
        out = rt.forward(ForwardBatch([SequenceSegment(s, self.tables[s], 0, p) for s, p in prompts.items()]))
        self._append(list(prompts), out.logits)

    def _append(self, slots: list[int], logits: torch.Tensor) -> None:
        for s, t in zip(slots, logits.argmax(-1).tolist(), strict=True):
            self.tokens[s].append(t)

    def decode(self, slots: list[int], device_ids: bool = False) -> torch.Tensor:
        segs = [SequenceSegment(s, self.tables[s], len(self.tokens[s]) - 1, [self.tokens[s][-1]])
                for s in slots]
        ids = None
        if device_ids:  # as the engine under async scheduling: list entries are stand-ins
            ids = torch.tensor([s.token_ids[0] for s in segs], device=self.rt.device)
            segs = [dataclasses.replace(s, token_ids=[-1]) for s in segs]
        out = self.rt.forward(ForwardBatch(segs, ids))
        assert out.row_offsets == list(range(len(slots) + 1))
        self._append(slots, out.logits)
        return out.logits

    def verify(self, slots: list[int], draft: list[int]) -> torch.Tensor:
        """A verification step: the newest token and `draft` per sequence, logits of every row; the
        draft is then rolled back (the next step starts at the newest token again)."""
        segs = [SequenceSegment(s, self.tables[s], len(self.tokens[s]) - 1, [self.tokens[s][-1], *draft],
                                "all") for s in slots]
        return self.rt.forward(ForwardBatch(segs)).logits


def test_replays_match_eager_steps_and_padding_touches_no_sequence(checkpoint: Path) -> None:
    eager = Greedy(load_runtime(checkpoint), batch=3)
    rt = recording_runtime(checkpoint)
    graphed = Greedy(rt, batch=3)
    # decode steps cover both parities of the ratio-2 compressor; batch 1 first, so that batch 3 grows
    # the shared output buffer (dropping the batch-1 graph, recaptured at the later batch-1 step)
    plan = [([3], False), ([1, 2, 3], False), ([1, 2, 3], True), ([1, 2, 3], False), ([2, 3], True),
            ([1, 2, 3], True), ([3], False), ([1, 2, 3], False)]
    for slots, device_ids in plan:
        want, got = eager.decode(slots, device_ids), graphed.decode(slots, device_ids)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    want, got = eager.verify([1, 3], [11, 12]), graphed.verify([1, 3], [11, 12])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert graphed.tokens == eager.tokens
    assert set(rt.graphs.graphs) == {FixedShape(4, 1, 2, "last"), FixedShape(2, 1, 2, "last"),
                                     FixedShape(1, 1, 2, "last"), FixedShape(2, 3, 2, "all")}
    for k, g in rt.graphs.graphs.items():  # each writes into the shared buffer of its logits rows
        assert g.logits.data_ptr() == rt.graphs.outputs[k.tokens].data_ptr()
    assert {k: tuple(v.shape) for k, v in rt.graphs.outputs.items()} == {1: (4, rt.vocab_size),
                                                                         3: (6, rt.vocab_size)}


def test_steps_outside_the_buckets_run_eagerly(checkpoint: Path) -> None:
    rt = load_runtime(checkpoint)
    g = Greedy(rt, batch=3)
    rt.graphs = DecodeGraphs(rt.builder, rt.last_is_consumer, rt.run_step, rt.vocab_size, rerun_recorder,
                             buckets=(1, 2))
    mixed = ForwardBatch([SequenceSegment(1, g.tables[1], PREFILL, [4]),
                          SequenceSegment(2, g.tables[2], PREFILL, [4, 5], "all")])
    for batch in (mixed, ForwardBatch([SequenceSegment(s, g.tables[s], PREFILL, [4]) for s in (1, 2, 3)])):
        assert rt.graphs.shape(batch) is None
    assert rt.graphs.shape(ForwardBatch([SequenceSegment(1, g.tables[1], PREFILL, [4], "none")])) is None
    with pytest.raises(ValueError, match="increasing positive"):
        DecodeGraphs(rt.builder, rt.last_is_consumer, rt.run_step, rt.vocab_size, rerun_recorder,
                     buckets=(4, 2))


def test_a_failed_capture_leaves_every_step_eager(checkpoint: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Each graph set (decode, draft, device-split steps) warns once, at its first failed capture, and
    runs its later steps eagerly without trying again."""
    captures = []

    def failing(step: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, Callable[[], None]]:
        captures.append(step)
        step()  # the warm-up ran, then the capture failed
        raise RuntimeError("operation not permitted when stream is capturing")

    eager = Greedy(load_runtime(checkpoint), batch=2)
    rt = recording_runtime(checkpoint, failing)
    graphed = Greedy(rt, batch=2)
    for _ in range(3):
        torch.testing.assert_close(graphed.decode([1, 2]), eager.decode([1, 2]), rtol=1e-4, atol=1e-4)
    assert rt.graphs.failed and not rt.graphs.graphs and len(captures) == 1
    assert "every step runs eagerly" in caplog.text
    slots = [1, 2]
    for _ in range(2):
        args = (slots, [len(graphed.tokens[s]) - 1 for s in slots], [graphed.tokens[s][-1] for s in slots])
        got, want = rt.dspark.draft(rt.cache, *args), eager.rt.dspark.draft(eager.rt.cache, *args)
        torch.testing.assert_close(got.base_logits, want.base_logits, rtol=1e-5, atol=1e-5)
    assert rt.dspark.graphs.failed and not rt.dspark.graphs.graphs and len(captures) == 2
    assert "capturing the draft forward of 2 sequences failed, drafts run eagerly" in caplog.text
    for rows in ([2, 1], [1, 2]):  # one draft verified per sequence, rows cut on the device
        segs = [SequenceSegment(s, graphed.tables[s], len(graphed.tokens[s]) - 1, [graphed.tokens[s][-1], 7],
                                "all") for s in slots]
        got, want = (r.forward_rows(ForwardBatch(segs), torch.tensor(rows), 3) for r in (rt, eager.rt))
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert rt.split_graphs.failed and not rt.split_graphs.graphs and len(captures) == 3
    assert "capturing the split step SplitShape(" in caplog.text and "split steps run eagerly" in caplog.text


def test_graphs_are_a_cuda_only_option(checkpoint: Path) -> None:
    rt = load_runtime(checkpoint, options=RuntimeOptions(cuda_graphs=True))
    rt.allocate_cache(num_blocks=2, num_slots=2)
    assert rt.graph_recorder is None and rt.graphs is None  # CPU: a no-op (logged)


def test_engine_generates_the_same_with_graphs(checkpoint: Path) -> None:
    """Through the engine: async scheduling (device token ids), chunked prefill beside decodes, forks
    (n=2 copies a slot), sequences finishing at different steps (the batch shrinks)."""
    prompts = [[0, *range(5 + 3 * i, 11 + 12 * i)] for i in range(3)]
    params = [SamplingParams(temperature=0, max_tokens=6 + 3 * i, ignore_eos=True) for i in range(3)]
    params.append(SamplingParams(temperature=0.8, seed=3, n=2, max_tokens=7, ignore_eos=True))
    prompts.append([0, 9, 8, 7, 6, 5])

    def generate(recorder: Callable | None) -> tuple[dict[str, list[list[int]]], DeepseekV41Runtime]:
        rt = recording_runtime(checkpoint, recorder)
        done, _ = run_requests(rt, list(zip(prompts, params, strict=True)), max_model_len=256, max_num_seqs=4,
                               max_num_batched_tokens=16)
        return done, rt

    eager, _ = generate(None)
    graphed, rt = generate(rerun_recorder)
    assert graphed == eager
    assert rt.graphs is not None and len(rt.graphs.graphs) >= 2


def test_engine_records_every_sampling_graph_at_start_up(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The engine records the sampler's graphs at start-up, after the forward graphs: each row bucket up to
    the one holding max_num_seqs, of each kind a step can take (greedy only, drawn, drawn and filtered),
    so that no step records one; plain steps replay them and draw the eager engine's tokens. Without a
    recorder (--enforce-eager) nothing is recorded."""
    phase, recorded, replays = ["start-up"], [], Counter()
    record = SamplingGraphs._record
    monkeypatch.setattr(SamplingGraphs, "_record", lambda self, key: recorded.append((phase[0], key))
                        or record(self, key))
    # finishing one after another, the steps go through every kind
    params = [SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
              SamplingParams(temperature=0.9, seed=1, max_tokens=7, ignore_eos=True),
              SamplingParams(temperature=0.7, top_k=4, top_p=0.9, seed=2, max_tokens=3, ignore_eos=True),
              SamplingParams(temperature=1.0, seed=3, logprobs=2, max_tokens=4, ignore_eos=True)]  # eager

    def generate(recorder: Callable | None) -> tuple[dict[str, list[int]], LLMEngine]:
        rt = recording_runtime(checkpoint, recorder)
        with caplog.at_level("INFO", logger="deepinfer.sampling.sampler"):
            engine = LLMEngine(rt, None, EngineConfig(max_model_len=256, max_num_seqs=3, cache_bytes=16 << 20,
                                                      log_stats_interval=0))
        graphs = engine.runner.sampler._graphs
        for key, graph in (graphs.graphs.items() if graphs else ()):
            graph.replay = lambda replay=graph.replay, key=key: replays.update([key]) or replay()
        phase[0] = "steps"
        for i, p in enumerate(params):
            engine.add_request([0, *range(3 + i, 9 + 2 * i)], p, request_id=f"r{i}")
        done = {}
        while engine.has_unfinished_requests():
            done |= {o.request_id: o.outputs[0].token_ids for o in engine.step() if o.finished}
        engine.close()
        return done, engine

    eager, engine = generate(None)
    assert engine.runner.sampler._graphs is None and not recorded
    phase[0] = "start-up"
    graphed, engine = generate(rerun_recorder)
    assert graphed == eager
    keys = {(b, drawn, filtered) for b in (1, 2, 4) for drawn, filtered in
            ((False, False), (True, False), (True, True))}
    assert set(engine.runner.sampler._graphs.graphs) == keys
    assert sorted(k for _, k in recorded) == sorted(keys) and {p for p, _ in recorded} == {"start-up"}
    assert {k[1:] for k in replays} == {(False, False), (True, False), (True, True)}
    assert "sampling graphs: recorded 9 graphs of up to 4 rows in" in caplog.text


def _cuda_runtimes(checkpoint: Path, dtype: torch.dtype, precision: str) -> tuple:
    options = RuntimeOptions(cache_precision=precision)  # type: ignore[arg-type]
    graphed = load_runtime(checkpoint, dtype=dtype, device="cuda", options=options)
    eager = load_runtime(checkpoint, dtype=dtype, device="cuda",
                         options=dataclasses.replace(options, cuda_graphs=False))
    return graphed, eager


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("precision", ["exact", "release"])
def test_graph_replay_is_bitwise_eager_at_a_bucket(checkpoint: Path, precision: str) -> None:
    graphed_rt, eager_rt = _cuda_runtimes(checkpoint, torch.bfloat16, precision)
    graphed, eager = Greedy(graphed_rt, batch=4), Greedy(eager_rt, batch=4)
    for step in range(6):
        got = graphed.decode([1, 2, 3, 4], device_ids=step % 2 == 1)
        want = eager.decode([1, 2, 3, 4], device_ids=step % 2 == 1)
        assert torch.equal(got, want), f"step {step}: max diff {(got - want).abs().max()}"
    assert set(graphed_rt.graphs.graphs) == {FixedShape(4, 1, 2, "last")}
    got, want = graphed.verify([1, 2, 3, 4], [5, 6]), eager.verify([1, 2, 3, 4], [5, 6])
    assert torch.equal(got, want)


@pytest.mark.gpu
@gpu
def test_graph_greedy_tokens_match_eager_and_the_reference_backend(checkpoint: Path) -> None:
    graphed_rt, eager_rt = _cuda_runtimes(checkpoint, torch.float32, "exact")
    ref_rt = load_runtime(checkpoint, device="cuda", backend="reference",
                          options=RuntimeOptions(cuda_graphs=False))
    runs = [Greedy(rt, batch=3) for rt in (graphed_rt, eager_rt, ref_rt)]
    for slots in ([1, 2, 3], [1, 2, 3], [2, 3], [1, 2, 3], [1, 2, 3], [3], [1, 2, 3], [1, 2, 3]):
        logits = [r.decode(slots) for r in runs]
        torch.testing.assert_close(logits[0], logits[1], rtol=1e-3, atol=1e-3)
    assert runs[0].tokens == runs[1].tokens == runs[2].tokens
    assert len(graphed_rt.graphs.graphs) == 3


@pytest.mark.gpu
@gpu
def test_gpu_captures_go_on_after_every_graph_of_the_pool_was_dropped(checkpoint: Path) -> None:
    """profile_step's order: a batch-1 decode graph, then a larger bucket that grows the shared output
    buffer (dropping the pool's only graph), then a new cache (dropping every graph) with an eager
    prefill and captures at a larger batch and table width. With a bare pool handle the allocator
    asserted at the second capture (use_count > 0) and every later step ran eagerly."""
    graphed_rt, eager_rt = _cuda_runtimes(checkpoint, torch.float32, "exact")
    for batch, blocks, order in ((4, 2, ([1], [1], [1, 2, 3, 4])), (8, 4, ([1, 2, 3, 4, 5, 6, 7, 8],))):
        graphed, eager = Greedy(graphed_rt, batch, blocks), Greedy(eager_rt, batch, blocks)
        for slots in order:
            torch.testing.assert_close(graphed.decode(slots), eager.decode(slots), rtol=1e-3, atol=1e-3)
        assert not graphed_rt.graphs.failed
        assert set(graphed_rt.graphs.graphs) == {FixedShape(batch, 1, blocks, "last")}
    assert graphed.tokens == eager.tokens


# --- padded verification, draft graphs, capture ahead


def readable_state(
    rt: DeepseekV41Runtime, slot: int, table: list[int], length: int
) -> dict[str, torch.Tensor]:
    """Every cache and state entry a later step of a sequence of `length` cached tokens may read:
    window rings (backbone and DSpark context) over the last W positions, compressor rings over the
    open group, compressed KV / index keys of its complete groups, the Engram history's last N - 1."""
    cache, mb, w = rt.cache, rt.max_backtrack, rt.cfg.sliding_window
    out = {}
    for (kind, layer), _ in cache.spec.slot_regions.items():
        ring = cache.window(layer) if kind == "window" else cache.compressor_state(layer)
        ratio = ring.length - mb + 1  # a compressor ring holds ratio - 1 + max_backtrack rows
        first = max(0, length - w) if kind == "window" else length - length % ratio
        out[f"{kind}{layer}"] = ring.data[slot, [p % ring.length for p in range(first, length)]]
    for (kind, layer), _ in cache.spec.block_regions.items():
        pool = cache.compressed_kv(layer) if kind == "kv" else cache.index_keys(layer)
        per_block = pool.data.shape[1]
        entries = range(length // (BLOCK_TOKENS // per_block))
        rows = [table[j // per_block] for j in entries]
        out[f"{kind}{layer}"] = pool.data[rows, [j % per_block for j in entries]]
    n = rt.cfg.engram_max_ngram_size
    out["history"] = rt.history[slot, [p % rt.history_len for p in range(max(0, length - n + 1), length)]]
    return out


def assert_same_state(
    a: DeepseekV41Runtime, b: DeepseekV41Runtime, seqs: dict[int, tuple[list[int], int]], tol: float = 2e-5
) -> None:
    for slot, (table, length) in seqs.items():
        want, got = readable_state(a, slot, table, length), readable_state(b, slot, table, length)
        for name, w in want.items():
            g = got[name]
            if w.dtype == torch.uint8:  # the exact cache stores float32 rows: equal up to GEMM rounding
                w, g = w.view(torch.float32), g.view(torch.float32)
            where = f"slot {slot}, {name}"
            torch.testing.assert_close(g, w, rtol=10 * tol, atol=tol, msg=lambda m, at=where: f"{at}: {m}")


def test_uneven_segments_pad_to_the_verification_length(checkpoint: Path) -> None:
    rt = load_runtime(checkpoint)
    rt.allocate_cache(num_blocks=7, num_slots=4)
    graphs = DecodeGraphs(rt.builder, rt.last_is_consumer, rt.run_step, rt.vocab_size, rerun_recorder,
                          max_backtrack=rt.max_backtrack)

    def shape(*segs: tuple[int, str]) -> FixedShape | None:
        starts = [PREFILL, BLOCK_TOKENS - 2, 3]  # the second one's padding passes its only block
        return graphs.shape(ForwardBatch([SequenceSegment(i + 1, [i + 1], starts[i], [4] * n, logits)
                                          for i, (n, logits) in enumerate(segs)]))

    assert shape((1, "last"), (3, "all")) == FixedShape(2, 3, 2, "all")  # to the longest
    graphs.verify_tokens = 4
    assert shape((1, "last"), (3, "all"), (2, "all")) == FixedShape(4, 4, 2, "all")
    assert shape((1, "last"), (1, "all")) == FixedShape(2, 1, 1, "last")  # decodes stay decodes
    assert shape((3, "all"), (3, "all")) == FixedShape(2, 4, 2, "all")
    assert shape((5, "all"), (2, "all")) == FixedShape(2, 5, 2, "all")  # past K: to the longest
    assert shape((1, "last"), (2, "last")) is None  # a prefill piece among decodes runs eagerly
    assert shape((7, "all"), (1, "last")) is None  # past the fixed-shape bound
    graphs.max_backtrack, graphs.verify_tokens = 1, None
    assert shape((1, "last"), (3, "all")) is None  # a rollback could not reach over the padded positions
    assert shape((3, "all"), (3, "all")) == FixedShape(2, 3, 2, "all")  # nothing to pad


def check_padded_verification(eager: DeepseekV41Runtime, graphed: DeepseekV41Runtime, tol: float) -> None:
    """Uneven verification segments (3, 1 and 4 tokens; the second one's padding spills past its only
    block) run as one 4-token graph; after it and after the rollback step every readable cache and
    state entry equals an eager run's, and the logits rows asked for match."""
    lens = {1: PREFILL, 2: BLOCK_TOKENS - 2, 3: PREFILL + 3}
    tables = {1: [1], 2: [2], 3: [3, 4]}
    prompts = {s: [3 + (5 * s + j) % 40 for j in range(n)] for s, n in lens.items()}
    drafts = {1: [7, 8], 2: [], 3: [9, 10, 11]}
    accepted = {1: 1, 2: 0, 3: 0}
    for rt in (eager, graphed):
        rt.allocate_cache(num_blocks=6, num_slots=4)
        rt.forward(ForwardBatch([SequenceSegment(s, tables[s], 0, p) for s, p in prompts.items()]))
    graphed.graphs.verify_tokens = 4

    def verify(rt: DeepseekV41Runtime):
        return rt.forward(ForwardBatch([
            SequenceSegment(s, tables[s], lens[s], [5, *drafts[s]], "all" if drafts[s] else "last")
            for s in lens]))

    want, got = verify(eager), verify(graphed)
    assert got.row_offsets == want.row_offsets == [0, 3, 4, 8]
    torch.testing.assert_close(got.logits, want.logits, rtol=tol, atol=tol)
    assert set(graphed.graphs.graphs) == {FixedShape(4, 4, 2, "all")}
    cached = {s: lens[s] + 1 + accepted[s] for s in lens}
    assert_same_state(eager, graphed, {s: (tables[s], cached[s]) for s in lens}, tol)
    # rollback: the next step starts right after the accepted tokens, overwriting the rest
    tables[2] = [2, 5]  # slot 2 crosses into a new block
    step = ForwardBatch([SequenceSegment(s, tables[s], cached[s], [6]) for s in lens])
    torch.testing.assert_close(graphed.forward(step).logits, eager.forward(step).logits, rtol=tol, atol=tol)
    assert_same_state(eager, graphed, {s: (tables[s], cached[s] + 1) for s in lens}, tol)


def test_padded_verification_leaves_the_state_unpadded_eager_leaves(checkpoint: Path) -> None:
    eager, graphed = load_runtime(checkpoint), recording_runtime(checkpoint)
    check_padded_verification(eager, graphed, 2e-5)


def test_draft_forward_replays_match_eager(checkpoint: Path) -> None:
    eager = Greedy(load_runtime(checkpoint), batch=3)
    rt = recording_runtime(checkpoint)
    graphed = Greedy(rt, batch=3)
    assert rt.dspark.graphs is not None
    for slots in ([1, 2, 3], [1, 3], [2]):  # buckets 4 (one padding sequence), 2, 1: one output buffer
        args = (slots, [len(graphed.tokens[s]) - 1 for s in slots], [graphed.tokens[s][-1] for s in slots])
        want, got = eager.rt.dspark.draft(eager.rt.cache, *args), rt.dspark.draft(rt.cache, *args)
        for name in ("hidden", "normed", "base_logits"):
            torch.testing.assert_close(getattr(got, name), getattr(want, name), rtol=1e-5, atol=1e-5)
    assert set(rt.dspark.graphs.graphs) == {1, 2, 4}
    assert rt.dspark.graphs.outputs[2].shape == (4 * rt.dspark.block_size, rt.vocab_size)


def test_planned_graphs_are_captured_with_the_cache(
    checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rt = recording_runtime(checkpoint)
    assert rt.plan_graphs(max_num_seqs=3, num_draft_tokens=3, max_model_len=BLOCK_TOKENS) == 0  # CPU: 0 B
    assert rt.cache is None  # the probe's throwaway cache is gone
    with caplog.at_level("INFO", logger="deepinfer.models.deepseek_v41.graphs"):
        rt.allocate_cache(num_blocks=7, num_slots=4)
    # buckets 1, 2, 4 x table widths 1, 2 (a verification may pass the first block) x decode / verify
    assert set(rt.graphs.graphs) == {FixedShape(b, n, w, "last" if n == 1 else "all")
                                     for b in (1, 2, 4) for w in (1, 2) for n in (1, 4)}
    assert set(rt.dspark.graphs.graphs) == {1, 2, 4}
    assert "CUDA graphs: captured 15 graphs of batch sizes 1,2,4 in" in caplog.text
    rt.plan_graphs(max_num_seqs=1, num_draft_tokens=0, max_model_len=BLOCK_TOKENS)  # no speculation
    rt.allocate_cache(num_blocks=7, num_slots=4)
    assert set(rt.graphs.graphs) == {FixedShape(1, 1, 1, "last"), FixedShape(1, 1, 2, "last")}
    assert not rt.dspark.graphs.graphs
    # a cache size fixed by the user: the capture is planned without the memory probe (no throwaway cache)
    assert rt.plan_graphs(max_num_seqs=2, num_draft_tokens=0, max_model_len=BLOCK_TOKENS,
                          measure_memory=False) == 0
    assert rt.cache is not None
    rt.allocate_cache(num_blocks=7, num_slots=4)
    assert {shape.num_seqs for shape in rt.graphs.graphs} == {1, 2}


def test_chosen_graph_sizes_are_the_only_buckets(checkpoint: Path, caplog: pytest.LogCaptureFixture) -> None:
    """cuda_graph_sizes (any order, repeats allowed) replaces the buckets of decode, verification and
    draft graphs: a batch pads up to the next size, a batch above the largest runs eagerly."""
    rt = recording_runtime(checkpoint, options=RuntimeOptions(cuda_graph_sizes=(4, 1, 4)))
    rt.plan_graphs(max_num_seqs=6, num_draft_tokens=3, max_model_len=BLOCK_TOKENS)
    with caplog.at_level("INFO", logger="deepinfer.models.deepseek_v41.graphs"):
        g = Greedy(rt, batch=6)
    assert rt.graph_buckets == (1, 4) and rt.dspark.graphs.buckets == (1, 4)
    assert {shape.num_seqs for shape in rt.graphs.graphs} == {1, 4} and set(rt.dspark.graphs.graphs) == {1, 4}
    assert "CUDA graphs: captured 10 graphs of batch sizes 1,4 in" in caplog.text

    def decode(slots: list[int]) -> ForwardBatch:
        return ForwardBatch([SequenceSegment(s, g.tables[s], PREFILL, [4]) for s in slots])

    assert rt.graphs.shape(decode([1, 2, 3])) == FixedShape(4, 1, 2, "last")  # two blocks each
    assert rt.graphs.shape(decode([1, 2, 3, 4, 5])) is None
    with pytest.raises(ValueError, match="increasing positive"):
        load_runtime(checkpoint, options=RuntimeOptions(cuda_graph_sizes=(0, 2)))


def test_triton_compilations_count_each_kernels_specialisations(monkeypatch: pytest.MonkeyPatch) -> None:
    triton = pytest.importorskip("triton")
    module = types.ModuleType("pkg.fake_kernels")
    module.triton = triton  # type: ignore[attr-defined]
    cache: dict[str, object] = {"key1": object()}
    module.kernel = types.SimpleNamespace(device_caches={0: (cache, {}, None)})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    compilations = TritonCompilations()
    before = compilations.counts()
    assert before["fake_kernels.kernel"] == 1
    cache["key2"] = object()  # a new specialisation
    assert compilations.counts() - before == Counter({"fake_kernels.kernel": 1})


@pytest.mark.parametrize(("sizes", "match"), [
    ([], "give at least one batch size"), ([0, 2], r"\[0\] not in \[1, max_num_seqs = 8\]"),
    ([1, 9, 16], r"\[9, 16\] not in")])
def test_bad_graph_sizes_name_the_option(sizes: list[int], match: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="cuda_graph_sizes: " + match):
        EngineConfig(max_num_seqs=8, cuda_graph_sizes=sizes)


def test_graph_sizes_reach_the_runtime_from_the_command_line(checkpoint: Path) -> None:
    from deepinfer.entrypoints.cli.engine_args import add_engine_args, llm_from_args
    from deepinfer.entrypoints.cli.errors import UsageError

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    base = ["--model", str(checkpoint), "--max-num-seqs", "8", "--max-model-len", "64", "--cache-mb", "8"]
    llm = llm_from_args(parser.parse_args([*base, "--cuda-graph-sizes", "8", "1"]))
    try:
        rt = llm.engine.model
        assert rt.options.cuda_graph_sizes == (8, 1) and rt.graph_buckets == (1, 8)
    finally:
        llm.close()
    with pytest.raises(UsageError, match=r"--cuda-graph-sizes: \[16\] not in"):
        llm_from_args(parser.parse_args([*base, "--cuda-graph-sizes", "16"]))
    assert parser.parse_args(base).cuda_graph_sizes is None


def speculative_outputs(
    make_runtime: Callable[[], DeepseekV41Runtime], speculator: str, schedule: str
) -> tuple[list[list[int]], LLMEngine]:
    """Greedy outputs of three requests with `speculator` through the engine (graphs captured ahead).
    The first prompt holds every token, so each newest token has a 1-gram match: n-gram drafts there,
    rarely for the short prompts, so verification steps mix 4- and 1-token segments."""
    rt = make_runtime()
    vocab = rt.vocab_size
    prompts = [[0, *torch.randperm(vocab - 1, generator=torch.Generator().manual_seed(0)).add(1).tolist()],
               [0, 9, 8, 7, 9, 8, 7, 9], [0, *range(20, 31)]]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    config = EngineConfig(max_model_len=vocab + 16, max_num_seqs=3, cache_bytes=16 << 20,
                          log_stats_interval=0, speculator=speculator, num_draft_tokens=3,
                          spec_schedule=schedule)
    engine = LLMEngine(rt, None, config, device=rt.device)  # its cache sizing plans the graphs
    for i, ids in enumerate(prompts):
        engine.add_request(ids, params, request_id=f"r{i}")
    done = {}
    while engine.has_unfinished_requests():
        done |= {o.request_id: o.outputs[0].token_ids for o in engine.step() if o.finished}
    engine.close()
    return [done[f"r{i}"] for i in range(len(prompts))], engine


@pytest.mark.parametrize(("speculator", "schedule"), [
    ("ngram", "fixed"), pytest.param("dspark", "confidence", marks=pytest.mark.slow)])
def test_engine_speculation_generates_the_same_with_graphs(
    checkpoint: Path, speculator: str, schedule: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Greedy speculative decoding through the engine: uneven draft counts per step (n-gram matches of
    different lengths, confidence-chosen counts) pad to the 4-token verification graphs."""
    pytest.importorskip("deepinfer_spec")
    pads = []
    pad = DecodeGraphs._pad
    monkeypatch.setattr(DecodeGraphs, "_pad", staticmethod(lambda seg, n: pads.append(n) or pad(seg, n)))

    eager, _ = speculative_outputs(lambda: load_runtime(checkpoint), speculator, schedule)
    assert not pads
    got, engine = speculative_outputs(lambda: recording_runtime(checkpoint), speculator, schedule)
    assert got == eager
    assert engine.model.graph_plan.verify_tokens == 4  # the engine's cache sizing planned the capture
    assert engine.runner.sampler._graphs is None  # verification samples every row: no sampler graphs
    assert engine.stats.spec_draft_tokens > 0 and pads and set(pads) == {4}
    if speculator == "dspark":
        assert engine.model.dspark.graphs.graphs


# --- GPU: the same checks with real graphs


@pytest.mark.gpu
@gpu
def test_gpu_padded_verification_leaves_the_state_unpadded_eager_leaves(checkpoint: Path) -> None:
    graphed, eager = _cuda_runtimes(checkpoint, torch.float32, "exact")
    check_padded_verification(eager, graphed, 1e-4)


@pytest.mark.gpu
@gpu
def test_gpu_draft_graph_replay_matches_eager(checkpoint: Path) -> None:
    graphed_rt, eager_rt = _cuda_runtimes(checkpoint, torch.bfloat16, "release")
    graphed = Greedy(graphed_rt, batch=4)
    Greedy(eager_rt, batch=4)  # the same prefills
    for slots in ([1, 2, 3, 4], [1, 3, 4]):  # a whole bucket (bitwise: same shapes), then with padding
        args = (slots, [len(graphed.tokens[s]) - 1 for s in slots], [graphed.tokens[s][-1] for s in slots])
        got = graphed_rt.dspark.draft(graphed_rt.cache, *args)
        want = eager_rt.dspark.draft(eager_rt.cache, *args)
        for name in ("hidden", "normed", "base_logits"):
            a, b = getattr(got, name), getattr(want, name)
            if len(slots) == 4:
                assert torch.equal(a, b), f"{name}: max diff {(a.float() - b.float()).abs().max()}"
            torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)
    assert set(graphed_rt.dspark.graphs.graphs) == {4}


@pytest.mark.gpu
@gpu
def test_gpu_planned_graphs_fit_the_memory_kept_for_them(checkpoint: Path) -> None:
    rt = load_runtime(checkpoint, dtype=torch.bfloat16, device="cuda")
    reserve = rt.plan_graphs(max_num_seqs=8, num_draft_tokens=3, max_model_len=2 * BLOCK_TOKENS)
    rt.allocate_cache(num_blocks=9, num_slots=9)
    outputs = sum(t.nbytes for t in [*rt.graphs.outputs.values(), *rt.dspark.graphs.outputs])
    used = rt.graph_recorder.pool_bytes() + outputs
    assert 0 < used <= reserve, (used, reserve)
    # buckets 1, 2, 4, 8 x table widths 1, 2, 4 x decode / verify; the draft forward per bucket
    assert len(rt.graphs.graphs) == 4 * 3 * 2 and len(rt.dspark.graphs.graphs) == 4


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("speculator", ["ngram", "dspark"])
def test_gpu_engine_speculation_generates_the_same_with_graphs(checkpoint: Path, speculator: str) -> None:
    pytest.importorskip("deepinfer_spec")

    def make(graphs: bool) -> Callable[[], DeepseekV41Runtime]:
        return lambda: load_runtime(checkpoint, device="cuda", options=RuntimeOptions(cuda_graphs=graphs))

    eager, _ = speculative_outputs(make(False), speculator, "fixed")
    got, engine = speculative_outputs(make(True), speculator, "fixed")
    assert got == eager and engine.stats.spec_draft_tokens > 0
