"""StepMetadata built on the device, for a step whose per-sequence row counts exist only there.

An asynchronous confidence-scheduled verification step (deepinfer-official §6-§7) is planned on the host
with each sequence's slot, start position and block table (known: it is planned after the step before it
was committed), an upper bound of its rows (its golden token and every proposed draft) and the step's
total T; the split of T among the sequences is made on the device from the newest confidences
(`deepinfer_spec.confidence.split_fixed_total`). This builder turns those device row counts q into the
StepMetadata the eager build (`MetadataBuilder.build`) makes for the segments truncated to q rows, with
torch ops on the device and no host read of a device value: rows packed per sequence, T in all.

Every shape and host int is then a function of the host plan and T alone:
- segments hold at most `StepGeometry.max_fixed_tokens` rows, so every ring (window, compressor state,
  Engram history) keeps all of a step's rows, as the eager build then does: its updates cover all T rows;
- compressed entries are sized by the upper bounds: entry place j of a sequence holds entry
  start // r + j, and a group the step does not complete is a padding entry in the fixed plan's
  convention (position 0, pool row 0 of the padding block, pooled from step row 0);
- `Compression.capacity` comes from the upper bounds (a wider indexer score than the eager one: entries
  past a row's `visible` are never selected);
- `RowSet.bounds` and `StepMetadata.row_offsets` are None: per-sequence host values that no op reads
  (the caller learns the rows once it reads q back).

The build has a host half (`host_arrays`: one upload) and a device half (`device_build`: torch ops on
the uploaded arrays, the row counts and the flat ids); padded to a `SplitShape` (a bucket of sequences,
the total, rows per sequence, table width) every size and host int is the shape's, so a CUDA graph can
hold the device half (split_graphs.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from deepinfer.cache import BLOCK_TOKENS
from deepinfer.models.deepseek_v41.metadata import (
    Compression,
    MetadataBuilder,
    RowSet,
    Staging,
    StepMetadata,
    _check_segments,
    _ranges,
)
from deepinfer.models.interface import SequenceSegment


@dataclass(frozen=True)
class SplitShape:
    """The graph key of a device-split step: `num_seqs` sequences (the real ones, then padding ones of
    no rows: slot 0, position 0, block 0), `rows` rows in all, at most `tokens` per sequence (entry
    places: ceil(tokens / r) each), block tables of `table_width` columns."""

    num_seqs: int
    rows: int
    tokens: int
    table_width: int


class DeviceMetadataBuilder:
    """Device builds beside a runtime's `MetadataBuilder` (its geometry and slot tables)."""

    def __init__(self, builder: MetadataBuilder) -> None:
        self.geo = builder.geo
        self.tables = builder.tables  # one per cache: the eager and fixed builds update it too
        self.staging = Staging(builder.staging.device)

    def fits(self, segs: Sequence[SequenceSegment]) -> bool:
        """Whether a step of these (upper-bound) segments can be built here: short segments with a
        logits row per token (verification and decode steps)."""
        most = self.geo.max_fixed_tokens
        return bool(segs) and all(
            len(s.token_ids) <= most and (s.logits == "all" or (s.logits == "last" and len(s.token_ids) == 1))
            for s in segs
        )

    def build(
        self, segs: Sequence[SequenceSegment], rows: torch.Tensor, total: int,
        input_ids: torch.Tensor | None = None,
    ) -> StepMetadata:
        """Metadata of `segs` cut to their first rows[b] tokens (device [B], 1 <= rows[b] <=
        len(token_ids), summing to the host int `total`, which is not checked: that would sync).
        `input_ids`: the segments' full token ids on the device, flat (else the lists' ids); the
        metadata's `input_ids` are the packed rows' ids. Every row gets a logits row."""
        if not segs:
            raise ValueError("a forward needs at least one segment")
        host = self.host_arrays(segs, with_ids=input_ids is None)
        names = list(host)
        t = dict(zip(names, self.staging.upload([host[n] for n in names]), strict=True))
        ends = np.array([s.start_pos + len(s.token_ids) for s in segs], dtype=np.int64)
        capacity = {r: int((ends // r).max()) for r in self.geo.ratios}
        return self.device_build(t, rows, total, t["ids"] if input_ids is None else input_ids, capacity)

    def host_arrays(
        self, segs: Sequence[SequenceSegment], with_ids: bool = True, shape: SplitShape | None = None
    ) -> dict[str, np.ndarray]:
        """What the host knows of the step (slots, starts, tables, the flat ids' offsets, and per ratio
        > 1 the entry places), checked; with `shape`, padded to it (every size then a function of it)."""
        geo = self.geo
        if not self.fits(segs) and segs:
            raise ValueError(f"device-built steps take segments of at most {geo.max_fixed_tokens} tokens "
                             "with logits for every token")
        slots = np.array(_check_segments(list(segs), geo.num_slots), dtype=np.int64)
        start = np.array([s.start_pos for s in segs], dtype=np.int64)
        most = np.array([len(s.token_ids) for s in segs], dtype=np.int64)
        table_lens = np.array(self.tables.update_segments(list(segs)), dtype=np.int64)
        short = slots[table_lens * BLOCK_TOKENS < start + most]
        if short.size:
            raise ValueError(f"block tables of slots {short.tolist()} do not cover their new positions")
        width = 1 << max(int(table_lens.max(initial=1)) - 1, 0).bit_length()
        ids = np.fromiter(chain.from_iterable(s.token_ids for s in segs), np.int64, int(most.sum()))
        id_base = np.cumsum(most) - most  # each sequence's first id in the flat upper-bound ids
        if shape is not None:
            if len(segs) > shape.num_seqs or most.max(initial=0) > shape.tokens or width > shape.table_width:
                raise ValueError(f"segments do not fit the split shape {shape}")
            pad = shape.num_seqs - len(segs)
            width = shape.table_width
            slots, start, id_base = (np.pad(a, (0, pad)) for a in (slots, start, id_base))
            ids = np.pad(ids, (0, shape.num_seqs * shape.tokens - ids.size))
        self.tables.reserve(width)
        tables = self.tables.rows[slots, :width]  # slot 0's row (padding) is block 0 throughout
        host = {"slots": slots, "seg_start": start, "tables": tables, "id_base": id_base}
        if with_ids:
            host["ids"] = ids
        for r in geo.ratios:
            if r > 1:
                first = start // r
                places = (np.full_like(start, -(-shape.tokens // r)) if shape is not None
                          else (start + most) // r - first)
                self._host_entries(r, first, places, start, slots, tables, host)
        return host

    def device_build(
        self, t: dict[str, torch.Tensor], rows: torch.Tensor, total: int, flat_ids: torch.Tensor,
        capacity: dict[int, int],
    ) -> StepMetadata:
        """The StepMetadata from the uploaded `host_arrays` `t`, the row counts `rows` (device, one per
        sequence of `t`, summing to `total`) and the flat upper-bound ids: torch ops only, no host read."""
        geo = self.geo
        num_seqs = t["slots"].shape[0]
        dev = t["slots"].device
        lens = rows.to(dev, torch.int64)
        seg_start, slot = t["seg_start"], t["slots"]
        end = seg_start + lens
        qsl = torch.cat((lens.new_zeros(1), lens.cumsum(0)))
        every = torch.arange(total, device=dev)
        row_seg = torch.repeat_interleave(torch.arange(num_seqs, device=dev), lens, output_size=total)
        offset = every - qsl[row_seg]  # row within its sequence
        pos = seg_start[row_seg] + offset
        replay = geo.replay
        consumer_from = (end - replay.keep).clamp_min(0) if replay.mode != "off" else torch.zeros_like(end)
        ring, w = geo.ring_len, geo.window
        ring_dest = slot[row_seg] * ring + pos % ring
        visible = {r: (pos + 1) // r for r in geo.ratios}
        keys = pos[:, None] + torch.arange(1 - w, 1, device=dev)  # [T, W] window key positions
        from_ring = keys < seg_start[row_seg, None]
        in_step = (geo.num_slots * ring - w + 1 + every)[:, None] + torch.arange(w, device=dev)
        window = torch.where(from_ring, slot[row_seg, None] * ring + keys % ring, in_step)

        def row_set(lo: torch.Tensor | None) -> RowSet:
            """Window keys before position 0, or before each sequence's `lo`, are none (-1)."""
            floor = 0 if lo is None else lo[row_seg, None]
            return RowSet(total, None, pos, row_seg, torch.where(keys >= floor, window, -1), ring_dest, every,
                          visible)

        all_rows = row_set(None)
        consumer_rows = all_rows if replay.mode == "off" else row_set(consumer_from)
        compression = {r: self._compression(r, t, capacity[r], slot, row_seg, pos, end, qsl, every)
                       for r in geo.ratios}
        engram_sources = history_dest = history_src = None
        if geo.engram_n:
            hl = geo.history_len
            shifts = torch.arange(geo.engram_n, device=dev)
            back = pos[:, None] - shifts  # [T, N] positions
            src = torch.where(back >= seg_start[row_seg, None], geo.num_slots * hl + every[:, None] - shifts,
                              slot[row_seg, None] * hl + back % hl)
            engram_sources = torch.where(back >= 0, src, -1)
            history_dest, history_src = slot[row_seg] * hl + pos % hl, every
        return StepMetadata(
            num_seqs=num_seqs, num_rows=total, slots=slot, seg_start=seg_start, seg_end=end,
            query_start_loc=qsl, block_tables=t["tables"], consumer_from=consumer_from, all_rows=all_rows,
            consumer_rows=consumer_rows, kept=every if replay.mode == "compact" else None,
            compression=compression, engram_sources=engram_sources, history_dest=history_dest,
            history_src=history_src, input_ids=flat_ids[t["id_base"][row_seg] + offset], logits_rows=every,
            row_offsets=None,
        )

    def _host_entries(self, r: int, first: np.ndarray, places: np.ndarray, start: np.ndarray,
                      slots: np.ndarray, tables: np.ndarray, host: dict[str, np.ndarray]) -> None:
        """Entry places of ratio r > 1: entries first[b] + j, j < places[b], with what the host knows of
        them (pool row, ring rows of their groups, group offsets from start); places past the table
        (padding only) read its last column."""
        seg = np.repeat(np.arange(len(first)), places)
        entries = _ranges(first, first + places)
        per_block, lc = BLOCK_TOKENS // r, self.geo.state_lens[r]
        group = entries[:, None] * r + np.arange(r)  # [M, r] positions
        col = np.minimum(entries // per_block, tables.shape[1] - 1)
        host[f"c{r}.seg"] = seg
        host[f"c{r}.entries"] = entries
        host[f"c{r}.dest"] = tables[seg, col] * per_block + entries % per_block
        host[f"c{r}.ring"] = slots[seg, None] * lc + group % lc
        host[f"c{r}.offset"] = group - start[seg, None]

    def _compression(
        self, r: int, t: dict[str, torch.Tensor], capacity: int, slot: torch.Tensor, row_seg: torch.Tensor,
        pos: torch.Tensor, end: torch.Tensor, qsl: torch.Tensor, every: torch.Tensor,
    ) -> Compression:
        if r == 1:  # every row completes its own entry, at the row's position
            col = pos // BLOCK_TOKENS
            dest = t["tables"][row_seg, col] * BLOCK_TOKENS + pos % BLOCK_TOKENS
            return Compression(1, capacity, len(every), pos, dest, None, None, None)
        seg, entries, offset = t[f"c{r}.seg"], t[f"c{r}.entries"], t[f"c{r}.offset"]
        pending = entries >= (end // r)[seg]  # not completed by this step's rows
        lc, num_slots = self.geo.state_lens[r], self.geo.num_slots
        sources = torch.where(offset >= 0, num_slots * lc + qsl[seg, None] + offset, t[f"c{r}.ring"])
        return Compression(
            r, capacity, len(entries), torch.where(pending, 0, entries * r),
            torch.where(pending, 0, t[f"c{r}.dest"]),
            torch.where(pending[:, None], num_slots * lc, sources), slot[row_seg] * lc + pos % lc, every,
        )
