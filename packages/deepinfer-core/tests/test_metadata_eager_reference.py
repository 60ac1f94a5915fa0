"""The eager build (MetadataBuilder.build) equals, value for value, the construction it replaced.

`ReferenceBuilder` is the eager build of commit 236de20 (masks over all rows, the window as a broadcast with
each sequence's first W - 1 rows written over it, every part recomputing the rows' positions), kept
here as the specification: every tensor and host value of the fast build must be bitwise equal to it,
on both window paths (host window; line shipped and gathered on the device), for prefill, chunked
prefill, decode, mixed and speculative-verification steps with ragged segments, in every replay mode.
"""

from __future__ import annotations

import random
from itertools import chain

import numpy as np
import pytest
import torch

from deepinfer.cache import BLOCK_TOKENS
from deepinfer.models.deepseek_v41 import metadata
from deepinfer.models.deepseek_v41.metadata import (
    BoundedReplay,
    Compression,
    MetadataBuilder,
    RowSet,
    StepGeometry,
    StepMetadata,
    _check_segments,
    _entry_positions,
    _ranges,
)
from deepinfer.models.interface import ForwardBatch, SequenceSegment
from deepinfer.testing.fields import fields_by_path

GEOMETRIES = {
    "flash": StepGeometry(128, 134, 40, {2: 7}, (1, 2), BoundedReplay(), 4, 9),
    "mask": StepGeometry(128, 134, 40, {2: 7, 4: 9}, (1, 2, 4), BoundedReplay("mask", 140)),
    "compact": StepGeometry(128, 134, 40, {2: 7}, (2,), BoundedReplay("compact", 140), 3, 6),
    "small": StepGeometry(4, 6, 40, {4: 6, 3: 5}, (1, 3, 4), BoundedReplay(), 2, 3),
}


class ReferenceBuilder(MetadataBuilder):
    """The previous eager construction (host window only)."""

    def build(self, batch: ForwardBatch, last_layer_is_consumer: bool, fixed=None, staging=None
              ) -> StepMetadata:
        assert fixed is None
        geo = self.geo
        segs = list(batch.segments)
        slots = np.array(_check_segments(segs, geo.num_slots), dtype=np.int64)
        start = np.array([s.start_pos for s in segs], dtype=np.int64)
        lens = np.array([len(s.token_ids) for s in segs], dtype=np.int64)
        end = start + lens
        qsl = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
        table_lens = np.array(self.tables.update_segments(segs), dtype=np.int64)
        width = 1 << max(int(table_lens.max()) - 1, 0).bit_length()
        self.tables.reserve(width)
        tables = self.tables.rows[slots, :width]
        replay = geo.replay
        consumer_from = np.maximum(end - replay.keep, 0) if replay.mode != "off" else np.zeros_like(end)
        zero = np.zeros_like(start)
        arrays = {"slots": slots, "seg_start": start, "seg_end": end, "qsl": qsl, "tables": tables,
                  "consumer_from": consumer_from}
        all_host = self._ref_rows("all", start, start, end, slots, zero, arrays)
        consumer_host = all_host
        if replay.mode == "mask":
            consumer_host = self._ref_rows("consumer", start, start, end, slots, consumer_from, arrays)
        elif replay.mode == "compact":
            first = np.maximum(start, consumer_from)
            consumer_host = self._ref_rows("consumer", start, first, end, slots, consumer_from, arrays)
            arrays["kept"] = _ranges(qsl[:-1] + (first - start), qsl[1:])
        for ratio in geo.ratios:
            self._ref_compression(ratio, start, end, slots, qsl, tables, arrays)
        if geo.engram_n:
            self._ref_engram(start, end, slots, qsl, arrays)
        last_bounds = consumer_host[0] if last_layer_is_consumer else all_host[0]
        picks, offsets = [], [0]
        for (b, e), s in zip(last_bounds, segs, strict=True):
            rows = range(b, e) if s.logits == "all" else [e - 1] if s.logits == "last" else []
            picks.extend(rows)
            offsets.append(offsets[-1] + len(rows))
        arrays["logits_rows"] = np.array(picks, dtype=np.int64)
        ids = chain.from_iterable(s.token_ids for s in segs)
        arrays["input_ids"] = np.fromiter(ids, np.int64, int(qsl[-1]))
        t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}

        def row_set(prefix: str, host: tuple) -> RowSet:
            bounds, count = host
            return RowSet(count, bounds, t[f"{prefix}.positions"], t[f"{prefix}.row_seg"],
                          t[f"{prefix}.window"], t[f"{prefix}.ring_dest"], t[f"{prefix}.ring_src"],
                          {r: t[f"{prefix}.visible{r}"] for r in geo.ratios})

        all_rows = row_set("all", all_host)
        consumer_rows = all_rows if consumer_host is all_host else row_set("consumer", consumer_host)
        compression = {
            r: Compression(r, int((end // r).max()), arrays[f"c{r}.pool_dest"].size, _entry_positions(t, r),
                           t[f"c{r}.pool_dest"], t.get(f"c{r}.sources"), t.get(f"c{r}.state_dest"),
                           t.get(f"c{r}.state_src"))
            for r in geo.ratios
        }
        return StepMetadata(
            num_seqs=len(segs), num_rows=int(qsl[-1]), slots=t["slots"], seg_start=t["seg_start"],
            seg_end=t["seg_end"], query_start_loc=t["qsl"], block_tables=t["tables"],
            consumer_from=t["consumer_from"], all_rows=all_rows, consumer_rows=consumer_rows,
            kept=t.get("kept"), compression=compression, engram_sources=t.get("engram_sources"),
            history_dest=t.get("history_dest"), history_src=t.get("history_src"),
            input_ids=t["input_ids"], logits_rows=t["logits_rows"], row_offsets=offsets,
        )

    def _ref_rows(self, prefix, start, first, end, slots, lo, arrays):
        geo = self.geo
        w, ring = geo.window, geo.ring_len
        base = geo.num_slots * ring - w + 1
        n = end - first
        begin = np.concatenate(([0], np.cumsum(n)[:-1])).astype(np.int64)
        pos = _ranges(first, end)
        seg = np.repeat(np.arange(len(n)), n)
        count = int(n.sum())
        edge = np.flatnonzero(pos < (np.maximum(first, lo) + w - 1)[seg])
        keys = pos[edge, None] - w + 1 + np.arange(w)
        s = seg[edge, None]
        from_ring = keys < start[s]
        ring_row = slots[s] * ring + keys % ring
        current = (base + edge)[:, None] + np.arange(w)
        valid = (keys >= np.maximum(lo[s], 0)) & (from_ring | (keys >= first[s]))
        window = (base + np.arange(count, dtype=np.int64))[:, None] + np.arange(w)
        window[edge] = np.where(valid, np.where(from_ring, ring_row, current), -1)
        arrays[f"{prefix}.window"] = window
        arrays[f"{prefix}.positions"] = pos
        arrays[f"{prefix}.row_seg"] = seg
        stored = (pos >= lo[seg]) & (pos >= end[seg] - ring)
        arrays[f"{prefix}.ring_dest"] = (slots[seg] * ring + pos % ring)[stored]
        arrays[f"{prefix}.ring_src"] = np.flatnonzero(stored).astype(np.int64)
        for r in geo.ratios:
            arrays[f"{prefix}.visible{r}"] = (pos + 1) // r
        return tuple(zip(begin.tolist(), (begin + n).tolist(), strict=True)), count

    def _ref_compression(self, r, start, end, slots, qsl, tables, arrays):
        geo, per_block = self.geo, BLOCK_TOKENS // r
        counts = end // r - start // r
        entries = _ranges(start // r, end // r)
        seg = np.repeat(np.arange(len(counts)), counts)
        arrays[f"c{r}.pool_dest"] = tables[seg, entries // per_block] * per_block + entries % per_block
        if r == 1:
            return
        arrays[f"c{r}.entry_positions"] = entries * r
        lc = geo.state_lens[r]
        group = entries[:, None] * r + np.arange(r)
        s = seg[:, None]
        in_step = geo.num_slots * lc + qsl[s] + group - start[s]
        arrays[f"c{r}.sources"] = np.where(group >= start[s], in_step, slots[s] * lc + group % lc)
        rows = np.arange(qsl[-1])
        row_seg = np.repeat(np.arange(len(counts)), end - start)
        pos = start[row_seg] + rows - qsl[row_seg]
        kept = pos >= end[row_seg] - lc
        arrays[f"c{r}.state_dest"] = (slots[row_seg] * lc + pos % lc)[kept]
        arrays[f"c{r}.state_src"] = rows[kept]

    def _ref_engram(self, start, end, slots, qsl, arrays):
        geo, hl = self.geo, self.geo.history_len
        rows = np.arange(qsl[-1])
        seg = np.repeat(np.arange(len(start)), end - start)
        pos = start[seg] + rows - qsl[seg]
        back = pos[:, None] - np.arange(geo.engram_n)
        s = seg[:, None]
        in_step = geo.num_slots * hl + rows[:, None] - np.arange(geo.engram_n)
        src = np.where(back >= start[s], in_step, slots[s] * hl + back % hl)
        arrays["engram_sources"] = np.where(back >= 0, src, -1)
        kept = pos >= end[seg] - hl
        arrays["history_dest"] = (slots[seg] * hl + pos % hl)[kept]
        arrays["history_src"] = rows[kept]


def _values(meta: StepMetadata) -> dict[str, object]:
    return fields_by_path(meta, lambda t: (str(t.dtype), tuple(t.shape), t.contiguous().numpy().tobytes()))


class Sequences:
    """Sequences in slots 1.., each at a position with a block table covering it (grown by appends)."""

    def __init__(self, rng: random.Random, count: int) -> None:
        self.rng = rng
        self.pos = [0] * (count + 1)
        self.tables: list[list[int]] = [[] for _ in range(count + 1)]
        self.next_block = 1

    def segment(self, slot: int, n: int, logits: str) -> SequenceSegment:
        table, start = self.tables[slot], self.pos[slot]
        while len(table) * BLOCK_TOKENS < start + n:
            table.append(self.next_block)
            self.next_block += 1
        ids = [self.rng.randrange(1000) for _ in range(n)]
        self.pos[slot] += n
        return SequenceSegment(slot, table, start, ids, logits)  # type: ignore[arg-type]


def steps(seed: int) -> list[tuple[str, ForwardBatch, bool]]:
    """Prefill (long, from 0), chunked prefill (not group-aligned), decode, mixed and verification steps."""
    rng = random.Random(seed)
    seqs = Sequences(rng, 30)
    out = []

    def step(label: str, parts: list[tuple[int, int, str]]) -> None:
        segs = [seqs.segment(slot, n, logits) for slot, n, logits in parts]
        out.append((label, ForwardBatch(segs), rng.random() < 0.5))

    step("prefill-2048", [(1, 2048, "last")])
    step("prefill-all", [(2, 300, "all")])
    step("chunk-odd", [(1, 333, "last")])  # starts at 2048, ends odd
    step("chunk-odd-2", [(1, 517, "none")])
    step("ragged-prefill", [(s, rng.randrange(1, 400), rng.choice(["last", "all", "none"]))
                            for s in range(3, 6)])
    for i in range(4):
        step(f"decode-{i}", [(s, 1, "last") for s in range(1, 6)])
    for n in (2, 3, 5, 7):
        step(f"verify-{n}", [(s, n, "all") for s in (1, 2, 3, 4, 5)])
    step("mixed", [(6, 1500, "last"), *[(s, 1, "last") for s in range(1, 6)], (7, 77, "all")])
    step("mixed-ragged", [(s, rng.randrange(1, 200), rng.choice(["last", "all"])) for s in range(1, 12)])
    step("short-new", [(s, rng.randrange(1, 5), "all") for s in range(12, 30)])
    step("decode-wide", [(s, 1, "last") for s in range(1, 30)])
    return out


@pytest.mark.parametrize("device_keys", [None, 0, 1 << 40], ids=["default", "device", "host"])
@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_eager_build_equals_reference(name: str, device_keys: int | None, monkeypatch) -> None:
    """`device_keys`: the window-size bound from which the window is gathered on the device."""
    if device_keys is not None:
        monkeypatch.setattr(metadata, "DEVICE_WINDOW_KEYS", device_keys)
    geo = GEOMETRIES[name]
    for seed in range(2):
        fast, ref = MetadataBuilder(geo, "cpu"), ReferenceBuilder(geo, "cpu")
        for label, batch, last in steps(seed):
            got, want = _values(fast.build(batch, last)), _values(ref.build(batch, last))
            assert list(got) == list(want), label
            assert [k for k in want if got[k] != want[k]] == [], label


def test_large_prefill_takes_the_device_gather() -> None:
    """A 2048-token prefill at W 128 ships the window line, not the [T, W] window (`_device_window`)."""
    geo = GEOMETRIES["flash"]
    builder = MetadataBuilder(geo, "cpu")
    seqs = Sequences(random.Random(0), 2)
    shipped: list[int] = []
    upload = builder.staging.upload

    def spy(arrays: list[np.ndarray]) -> list[torch.Tensor]:
        shipped.append(sum(a.size for a in arrays))
        return upload(arrays)

    builder.staging.upload = spy  # type: ignore[method-assign]
    meta = builder.build(ForwardBatch([seqs.segment(1, 2048, "last")]), False)
    assert meta.all_rows.window.shape == (2048, 128) and meta.all_rows.window.is_contiguous()
    assert shipped[0] < 2048 * 16
