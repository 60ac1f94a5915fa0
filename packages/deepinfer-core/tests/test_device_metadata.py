"""The device build of a step whose rows per sequence exist only on the device (device_metadata.py)
equals the host eager build of the same segments cut to those rows: random verification batches
(ragged rows, one row, windows reaching before position 0, block boundaries, ratios 1 and > 1, Engram,
bounded replay); compressed entry places the step does not complete are padding entries."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from deepinfer.cache import BLOCK_TOKENS
from deepinfer.models.deepseek_v41.device_metadata import DeviceMetadataBuilder, SplitShape
from deepinfer.models.deepseek_v41.metadata import (
    BoundedReplay,
    MetadataBuilder,
    RowSet,
    StepGeometry,
    StepMetadata,
)
from deepinfer.models.interface import ForwardBatch, SequenceSegment

GEOMETRIES = {
    # window 4, ring 6, ratio 4 ring 6, Engram 2-grams over 3 ids: 3 rows per sequence at most
    "small": StepGeometry(4, 6, 9, {4: 6}, (1, 4), BoundedReplay(), 2, 3),
    # Flash-like: window 128, ratios 1 and 2, Engram 4-grams: 7 rows
    "flash": StepGeometry(128, 134, 9, {2: 7}, (1, 2), BoundedReplay(), 4, 9),
    "mask": StepGeometry(8, 14, 9, {2: 7, 4: 9}, (1, 2, 4), BoundedReplay("mask", 14)),
    "compact": StepGeometry(8, 14, 9, {2: 7}, (2,), BoundedReplay("compact", 14), 3, 8),
}


def _batch(rng: random.Random, geo: StepGeometry) -> tuple[list[SequenceSegment], list[int]]:
    """Upper-bound segments (1 + drafts, logits for every row) and the rows each one keeps."""
    most = geo.max_fixed_tokens
    slots = rng.sample(range(1, geo.num_slots), rng.randint(1, geo.num_slots - 1))
    blocks = iter(rng.sample(range(1, 200), 150))
    segs, rows = [], []
    for slot in slots:
        m = rng.randint(1, most)
        kind = rng.random()
        if kind < 0.3:  # young: the window reaches before position 0
            start = rng.randint(0, geo.window)
        elif kind < 0.6:  # across a block boundary
            start = BLOCK_TOKENS * rng.randint(1, 3) - rng.randint(0, m)
        else:
            start = rng.randint(0, 3 * BLOCK_TOKENS)
        table = [next(blocks) for _ in range(-(-(start + m) // BLOCK_TOKENS))]
        ids = [rng.randrange(1000) for _ in range(m)]
        logits = "all" if m > 1 or rng.random() < 0.5 else "last"
        segs.append(SequenceSegment(slot, table, start, ids, logits))
        rows.append(rng.choice([1, m, rng.randint(1, m)]))
    return segs, rows


def _same(a: torch.Tensor | None, b: torch.Tensor | None, what: str) -> None:
    assert (a is None) == (b is None), what
    if a is not None:
        assert torch.equal(a.cpu(), b.cpu()), f"{what}: {a.tolist()} != {b.tolist()}"


def _same_rows(dev: RowSet, host: RowSet, what: str) -> None:
    assert dev.count == host.count, what
    for name in ("positions", "row_seg", "window", "ring_dest", "ring_src"):
        _same(getattr(dev, name), getattr(host, name), f"{what}.{name}")
    assert dev.visible.keys() == host.visible.keys()
    for r in dev.visible:
        _same(dev.visible[r], host.visible[r], f"{what}.visible{r}")


def _check(geo: StepGeometry, segs: list[SequenceSegment], rows: list[int], dev: StepMetadata,
           host: StepMetadata) -> None:
    for name in ("num_seqs", "num_rows"):
        assert getattr(dev, name) == getattr(host, name), name
    for name in ("slots", "seg_start", "seg_end", "query_start_loc", "block_tables", "consumer_from", "kept",
                 "engram_sources", "history_dest", "history_src", "input_ids", "logits_rows"):
        _same(getattr(dev, name), getattr(host, name), name)
    _same_rows(dev.all_rows, host.all_rows, "all_rows")
    _same_rows(dev.consumer_rows, host.consumer_rows, "consumer_rows")
    start = np.array([s.start_pos for s in segs])
    most = start + [len(s.token_ids) for s in segs]
    end = start + rows
    for r, c in dev.compression.items():
        h = host.compression[r]
        assert c.capacity >= h.capacity and c.capacity == int((most // r).max())
        if r == 1:
            for name in ("entry_positions", "pool_dest"):
                _same(getattr(c, name), getattr(h, name), f"c{r}.{name}")
            assert c.count == h.count
            continue
        entries = np.concatenate([np.arange(s // r, e // r) for s, e in zip(start, most, strict=True)])
        places = [e // r - s // r for s, e in zip(start, most, strict=True)]
        real = torch.from_numpy(entries < np.repeat(end // r, places))
        assert c.count == len(entries) and int(real.sum()) == h.count
        _same(c.entry_positions[real], h.entry_positions, f"c{r}.entry_positions")
        _same(c.pool_dest[real], h.pool_dest, f"c{r}.pool_dest")
        _same(c.sources[real], h.sources, f"c{r}.sources")
        assert (c.entry_positions[~real] == 0).all() and (c.pool_dest[~real] == 0).all()
        assert (c.sources[~real] == geo.num_slots * geo.state_lens[r]).all()  # pooled from step row 0
        _same(c.state_dest, h.state_dest, f"c{r}.state_dest")
        _same(c.state_src, h.state_src, f"c{r}.state_src")


@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_device_build_equals_the_eager_build_of_the_cut_segments(name: str) -> None:
    geo, rng = GEOMETRIES[name], random.Random(name)
    builder = MetadataBuilder(geo, "cpu")
    device = DeviceMetadataBuilder(builder)
    for step in range(40):
        segs, rows = _batch(rng, geo)
        assert device.fits(segs)
        cut = [SequenceSegment(s.slot, s.block_table, s.start_pos, s.token_ids[:q], s.logits)
               for s, q in zip(segs, rows, strict=True)]
        host = builder.build(ForwardBatch(cut), last_layer_is_consumer=step % 2 == 0)
        ids = None
        if step % 3 == 0:  # ids from the device (drafts gathered there), the lists holding stand-ins
            ids = torch.tensor([t for s in segs for t in s.token_ids])
            segs = [SequenceSegment(s.slot, s.block_table, s.start_pos, [-2] * len(s.token_ids), s.logits)
                    for s in segs]
        built = device.build(segs, torch.tensor(rows), sum(rows), ids)
        assert built.row_offsets is None and built.all_rows.bounds is None
        _check(geo, segs, rows, built, host)


def test_device_build_refuses_what_it_cannot_bound() -> None:
    geo = GEOMETRIES["small"]
    device = DeviceMetadataBuilder(MetadataBuilder(geo, "cpu"))
    long = SequenceSegment(1, [1], 0, [5] * (geo.max_fixed_tokens + 1), "all")
    chunk = SequenceSegment(1, [1], 0, [5, 6], "last")
    for seg in (long, chunk):
        assert not device.fits([seg])
        with pytest.raises(ValueError, match="at most 3 tokens"):
            device.build([seg], torch.tensor([1]), 1)
    with pytest.raises(ValueError, match="do not cover"):
        device.build([SequenceSegment(1, [1], 127, [5, 6], "all")], torch.tensor([2]), 2)


@pytest.mark.parametrize("name", ["flash", "mask"])
def test_device_build_reads_no_values_on_the_host(name: str) -> None:
    # Meta tensors hold no data: any device value read on the host (a sync on a GPU) would raise.
    geo = GEOMETRIES[name]
    device = DeviceMetadataBuilder(MetadataBuilder(geo, "meta"))
    segs, _ = _batch(random.Random(1), geo)
    total = 2 * len(segs)
    built = device.build(segs, torch.empty(len(segs), dtype=torch.int64, device="meta"), total)
    assert built.input_ids.shape == (total,) and built.all_rows.window.shape == (total, geo.window)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_device_build_never_syncs_and_equals_the_eager_build() -> None:
    from deepinfer_spec.confidence import cumulative_confidence, split_fixed_total

    geo, rng = GEOMETRIES["flash"], random.Random(7)
    builder = MetadataBuilder(geo, "cuda")
    device = DeviceMetadataBuilder(builder)
    segs, _ = _batch(rng, geo)
    k = torch.tensor([len(s.token_ids) - 1 for s in segs])
    conf = torch.rand(len(segs), geo.max_fixed_tokens - 1, generator=torch.Generator().manual_seed(3))
    total = len(segs) + int(k.sum()) // 2
    conf_d, k_d = conf.cuda(), k.cuda()
    device.build(segs, 1 + k_d, len(segs) + int(k.sum()))  # first use: lazy CUDA initialisation may sync
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:  # the runner's device half: split the total, then build the step's metadata
        rows = 1 + split_fixed_total(cumulative_confidence(conf_d), total, k_d)
        built = device.build(segs, rows, total)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    rows_host = rows.cpu().tolist()
    cut = [SequenceSegment(s.slot, s.block_table, s.start_pos, s.token_ids[:q], s.logits)
           for s, q in zip(segs, rows_host, strict=True)]
    _check(geo, segs, rows_host, built, builder.build(ForwardBatch(cut), last_layer_is_consumer=False))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory):
    from deepinfer.testing import write_tiny_checkpoint

    return write_tiny_checkpoint("full", tmp_path_factory.mktemp("full"), seed=0)


def _forward_rows_equals_the_cut_forward(checkpoint, device: str, replay: str, graphs: bool = False) -> None:
    """Verification steps through `forward_rows` (rows counts on `device`; with `graphs`, through split
    graphs recorded by the CPU stand-in) give the logits of the same steps cut on the host, run eagerly
    by a second runtime in the same state, and leave the same cache: the next decode step agrees too."""
    from deepinfer.models.deepseek_v41.graphs import DecodeGraphs
    from deepinfer.models.deepseek_v41.runtime import RuntimeOptions, load_runtime
    from deepinfer.models.deepseek_v41.split_graphs import SplitGraphs
    from deepinfer.testing.recorder import rerun_recorder

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    runtimes = []
    for _ in range(2):
        rt = load_runtime(checkpoint, dtype=dtype, device=device, options=RuntimeOptions(cuda_graphs=False))
        if replay != "off":
            rt = load_runtime(checkpoint, dtype=dtype, device=device, options=RuntimeOptions(
                cuda_graphs=False, replay_mode=replay, replay_keep=rt.cfg.sliding_window + rt.max_backtrack))
        runtimes.append(rt)
    k = runtimes[0].max_backtrack - 1  # drafts per sequence: a step of 1 + k rows
    lens = [3, 9, 17, 30]  # windows reaching before position 0, and not
    first = [SequenceSegment(i + 1, [i + 1], 0, [5 + (3 * i + j) % 40 for j in range(n)], "last")
             for i, n in enumerate(lens)]
    for rt in runtimes:
        rt.allocate_cache(num_blocks=len(lens) + 1, num_slots=len(lens) + 1)
        rt.forward(ForwardBatch(first))
    split_rt = runtimes[0]
    if graphs:
        split_rt.graphs = DecodeGraphs(split_rt.builder, split_rt.last_is_consumer, split_rt.run_step,
                                       split_rt.vocab_size, rerun_recorder,
                                       max_backtrack=split_rt.max_backtrack, verify_tokens=1 + k)
        split_rt.split_graphs = SplitGraphs(split_rt.device_builder, split_rt.graphs, split_rt.run_step)
    # graphs pad the total to split_graphs.GRANULE rows: other GEMM shapes, another summation order
    tol = {"atol": 1e-4 if graphs else 1e-5, "rtol": 1e-4 if graphs else 1e-5} if device == "cpu" else {
        "atol": 2e-2, "rtol": 2e-2}
    # two steps of one total (one graph), then another total and three sequences (a padded bucket)
    steps = (([1, 2, 3, 4], [1, 1 + k, 2, k]), ([1, 2, 3, 4], [k, 2, 1 + k, 1]), ([2, 3, 4], [1, 2, 2]))
    for slots, rows in steps:
        upper = [SequenceSegment(s, [s], lens[s - 1], [9 + (5 * s + j) % 40 for j in range(1 + k)], "all")
                 for s in slots]
        cut = [SequenceSegment(u.slot, u.block_table, u.start_pos, u.token_ids[:q], "all")
               for u, q in zip(upper, rows, strict=True)]
        batch = ForwardBatch(upper)
        if rows[0] == k:  # ids on the device, the lists holding stand-ins (as the engine passes drafts)
            ids = torch.tensor([t for u in upper for t in u.token_ids], device=device)
            batch = ForwardBatch([SequenceSegment(u.slot, u.block_table, u.start_pos, [-2] * (1 + k), "all")
                                  for u in upper], ids)
        split = split_rt.forward_rows(batch, torch.tensor(rows, device=device), sum(rows))
        torch.testing.assert_close(split, runtimes[1].forward(ForwardBatch(cut)).logits, **tol)
        if device == "cuda" and graphs:  # the step again (a rollback), its graph now captured: no sync
            counts = torch.tensor(rows, device=device)
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                again = split_rt.forward_rows(batch, counts, sum(rows))
            finally:
                torch.cuda.set_sync_debug_mode("default")
            torch.testing.assert_close(again, split, **tol)
        for s, q in zip(slots, rows, strict=True):
            lens[s - 1] += q - 1  # the next step starts at the last row kept (as after a rejected draft)
    if graphs:
        from deepinfer.models.deepseek_v41 import split_graphs

        assert len(split_rt.split_graphs.graphs) == min(2, split_graphs.MAX_GRAPHS)
    after = [SequenceSegment(i + 1, [i + 1], n, [11 + i], "last") for i, n in enumerate(lens)]
    torch.testing.assert_close(split_rt.forward(ForwardBatch(after)).logits,
                               runtimes[1].forward(ForwardBatch(after)).logits, **tol)


@pytest.mark.parametrize(("replay", "graphs"), [("off", False), ("compact", False), ("off", True)])
def test_forward_rows_equals_the_forward_of_the_cut_step(checkpoint, replay: str, graphs: bool) -> None:
    _forward_rows_equals_the_cut_forward(checkpoint, "cpu", replay, graphs)


def _split_graphs(checkpoint):
    """Split graphs over a CPU runtime with room for 5 sequences: buckets 1, 2, 4, 8, steps of up to
    max_backtrack rows a sequence, recorded by the CPU stand-in."""
    from deepinfer.models.deepseek_v41.graphs import DecodeGraphs
    from deepinfer.models.deepseek_v41.runtime import RuntimeOptions, load_runtime
    from deepinfer.models.deepseek_v41.split_graphs import SplitGraphs
    from deepinfer.testing.recorder import rerun_recorder

    rt = load_runtime(checkpoint, options=RuntimeOptions(cuda_graphs=False))
    rt.allocate_cache(num_blocks=6, num_slots=6)
    tokens = rt.max_backtrack  # 1 + the drafts a step verifies
    decode = DecodeGraphs(rt.builder, rt.last_is_consumer, rt.run_step, rt.vocab_size, rerun_recorder,
                          buckets=(1, 2, 4, 8), max_backtrack=tokens, verify_tokens=tokens)
    return SplitGraphs(rt.device_builder, decode, rt.run_step)


def test_split_graphs_beyond_their_cap_drop_the_least_recently_used(checkpoint, monkeypatch) -> None:
    """At the cap the least recently used graph goes (A, B, A, C keeps A and C); a graph whose shared
    output buffer was replaced is captured again, with the same logits."""
    from deepinfer.models.deepseek_v41 import split_graphs

    monkeypatch.setattr(split_graphs, "MAX_GRAPHS", 2)
    graphs = _split_graphs(checkpoint)
    decode, tokens = graphs.decode, graphs.tokens
    captured = []
    capture = graphs._capture
    monkeypatch.setattr(graphs, "_capture", lambda shape: captured.append(shape) or capture(shape))

    def step(rows: list[int]) -> tuple[split_graphs.SplitShape, torch.Tensor]:
        segs = [SequenceSegment(s, [s], 0, [7 + s] * tokens, "all") for s in range(1, len(rows) + 1)]
        batch = ForwardBatch(segs)
        return graphs.shape(batch, sum(rows)), graphs.forward(batch, torch.tensor(rows), sum(rows))

    # A first: the largest, so the shared output buffer never grows (growing it recaptures older graphs)
    many = [tokens, tokens, 1]
    (a, first), (b, _), (_, again), (c, _) = step(many), step([1]), step(many), step([1] * 5)
    assert len({a, b, c}) == 3 and captured == [a, b, c]  # A's second step replayed its graph
    assert set(graphs.graphs) == {a, c}
    torch.testing.assert_close(again, first)
    decode._output(tokens, 2 * decode.outputs[tokens].shape[0])  # a larger shared buffer replaces it
    _, recaptured = step(many)
    assert captured == [a, b, c, a]
    torch.testing.assert_close(recaptured, first)


def test_split_graph_keys_pad_the_total_to_the_granule(checkpoint) -> None:
    """Totals in one granule share a graph; the padding rows go to padding sequences counted in the bucket,
    and a step whose padding sequences would pass the largest bucket keeps its exact total."""
    from deepinfer.models.deepseek_v41.split_graphs import GRANULE

    split = _split_graphs(checkpoint)
    tokens = split.tokens

    def batch(n: int) -> ForwardBatch:
        return ForwardBatch([SequenceSegment(s, [s], 0, [7] * tokens, "all") for s in range(1, n + 1)])

    keys = {split.shape(batch(3), t) for t in range(GRANULE + 1, min(2 * GRANULE, 3 * tokens) + 1)}
    room = -(-(GRANULE - 1) // tokens)  # padding sequences of the largest padding
    assert keys == {SplitShape(4 if 3 + room <= 4 else 8, 2 * GRANULE, tokens, 1)}
    full = split.shape(batch(8), 8 + 1)  # 8 sequences fill the largest bucket: no room for padding ones
    assert full == SplitShape(8, 8 + 1, tokens, 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("graphs", [False, True])
def test_cuda_forward_rows_equals_the_forward_of_the_cut_step(checkpoint, graphs: bool) -> None:
    _forward_rows_equals_the_cut_forward(checkpoint, "cuda", "off", graphs)
