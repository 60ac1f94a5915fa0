"""StepMetadata: the flat per-step tensors every layer op reads, built once per forward on the host.

The builder turns the engine's ForwardBatch (Python lists) into index arrays with numpy, packs them
into one persistent int64 staging buffer (pinned on accelerators, double-buffered so the next build
never overwrites a copy still in flight) and copies it to a persistent device buffer with one
non-blocking copy. The forward then sees only tensors, plus host ints derived from the lists (row
counts, capacities). Row sets, index conventions and the meaning of each field: docs/architecture.md.

A build for a `FixedShape` (CUDA graphs, graphs.py) pads the batch with padding sequences (slot 0,
block table of block 0, both reserved for padding) and pads every data-dependent count to its bound,
so every tensor shape and host int is a function of the shape alone; the padding writes only to
slot 0's rings and block 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from deepinfer.cache import BLOCK_TOKENS
from deepinfer.models.interface import ForwardBatch, SequenceSegment

ReplayMode = Literal["off", "mask", "compact"]


@dataclass(frozen=True)
class BoundedReplay:
    """SWA bounded replay (deepinfer-official §8): consumer layers need only the kept suffix."""

    mode: ReplayMode = "off"
    keep: int = 140


@dataclass(frozen=True)
class StepGeometry:
    """What the index arithmetic needs besides the batch; fixed for a runtime's cache."""

    window: int  # sliding window W
    ring_len: int  # SWA ring entries per slot: W + max_backtrack
    num_slots: int  # slots of the state pool (ring rows = num_slots * ring_len)
    state_lens: dict[int, int]  # compress ratio (> 1) -> compressor ring entries per slot
    ratios: tuple[int, ...]  # compress ratios of the KV sources
    replay: BoundedReplay
    engram_n: int = 0  # Engram max n-gram size (0: no Engram)
    history_len: int = 0  # Engram token-id ring entries per slot

    @property
    def max_fixed_tokens(self) -> int:
        """Most tokens per sequence for which every ring keeps all of a step's rows (fixed row counts)
        and a padding sequence fits the padding block."""
        bounds = [BLOCK_TOKENS, self.ring_len, *self.state_lens.values(), self.history_len or self.ring_len]
        if self.replay.mode != "off":
            bounds.append(self.replay.keep)
        return min(bounds)


@dataclass(frozen=True)
class FixedShape:
    """A step shape whose metadata has the same tensor shapes and host ints whatever the batch:
    up to `num_seqs` sequences of `tokens` tokens each, block tables of `table_width` columns."""

    num_seqs: int
    tokens: int
    table_width: int
    logits: Literal["last", "all"]


@dataclass(frozen=True)
class RowSet:
    """Token rows a layer computes (all rows, or the consumer layers' rows under bounded replay).

    positions [n] / row_seg [n]: absolute position and sequence of each row. window [n, W]: each row's
    window keys, r < S * L = ring row r (slot * L + pos % L), r >= S * L = row r - S * L of this set,
    -1 = none. ring_dest/ring_src: ring rows that receive this set's keys, and the rows they come from.
    """

    count: int
    bounds: tuple[tuple[int, int], ...]  # host: each sequence's [begin, end) rows
    positions: torch.Tensor
    row_seg: torch.Tensor
    window: torch.Tensor
    ring_dest: torch.Tensor
    ring_src: torch.Tensor


@dataclass(frozen=True)
class Compression:
    """New compressed entries of one compress ratio in this step (compressors run on all rows).

    entry_positions [M]: position of each new entry's group start (its RoPE position); pool_dest [M]:
    flat pool row (block * E + j % E) of entry j; sources [M, ratio] (ratio > 1): rows of each group,
    r < S * Lc = compressor ring row, else step row r - S * Lc; state_dest/state_src: ring update.
    capacity: max entries of any sequence after this step (score width of the indexer).
    """

    ratio: int
    capacity: int
    count: int
    entry_positions: torch.Tensor
    pool_dest: torch.Tensor
    sources: torch.Tensor | None
    state_dest: torch.Tensor | None
    state_src: torch.Tensor | None


@dataclass(frozen=True)
class StepMetadata:
    num_seqs: int
    num_rows: int
    slots: torch.Tensor  # [B]
    seg_start: torch.Tensor  # [B] position of each sequence's first new token
    seg_end: torch.Tensor  # [B] one past its last
    query_start_loc: torch.Tensor  # [B + 1] first row of each sequence (all rows)
    block_tables: torch.Tensor  # [B, max_blocks] padded with block 0
    consumer_from: torch.Tensor  # [B] consumer layers see no window keys before this position
    all_rows: RowSet
    consumer_rows: RowSet  # all_rows unless bounded replay is on
    kept: torch.Tensor | None  # compact replay: consumer rows as indices into all rows
    compression: dict[int, Compression]
    engram_sources: torch.Tensor | None  # [T, N]: n-gram token rows in [history ring ; input ids], -1
    history_dest: torch.Tensor | None  # history ring rows written with input ids of history_src
    history_src: torch.Tensor | None
    input_ids: torch.Tensor  # [T] the lists' token ids (stand-ins where the engine passes input_ids)
    logits_rows: torch.Tensor  # rows (of the last layer's row set) whose logits are returned
    row_offsets: list[int]  # host: first logits row of each sequence (len B + 1)


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Concatenation of arange(starts[i], ends[i])."""
    lens = ends - starts
    total = int(lens.sum())
    firsts = np.cumsum(lens) - lens
    return np.arange(total, dtype=np.int64) - np.repeat(firsts - starts, lens)


class Staging:
    """Persistent int64 buffers: two host buffers (pinned on accelerators) and one device buffer.

    `persistent`: every upload lands at the same address (CUDA graph inputs): always through the
    device-side buffer (on the CPU too), whose size is then fixed by the first upload.
    """

    def __init__(self, device: torch.device, persistent: bool = False) -> None:
        self.device = device
        self.persistent = persistent
        self.pinned = device.type == "cuda"
        self.host: list[torch.Tensor] = [torch.empty(0, dtype=torch.int64)] * 2
        self.events: list[torch.cuda.Event | None] = [None, None]
        self.dev = torch.empty(0, dtype=torch.int64, device=device)
        self.turn = 0

    def upload(self, arrays: list[np.ndarray]) -> list[torch.Tensor]:
        sizes = [a.size for a in arrays]
        total = sum(sizes)
        capacity = 1 << max(total, 1024).bit_length()
        if self.events[self.turn] is not None:
            self.events[self.turn].synchronize()  # the copy that last read this buffer is done
        if self.host[self.turn].numel() < total:
            self.host[self.turn] = torch.empty(capacity, dtype=torch.int64, pin_memory=self.pinned)
        host = self.host[self.turn]
        if total:
            np.concatenate([a.ravel() for a in arrays], out=host.numpy()[:total])
        if self.device.type == "cpu" and not self.persistent:
            flat = host[:total]
        else:
            if self.dev.numel() < total:
                if self.persistent and self.dev.numel():
                    raise RuntimeError(f"persistent staging holds {self.dev.numel()} values, got {total}")
                self.dev = torch.empty(capacity, dtype=torch.int64, device=self.device)
            flat = self.dev[:total]
            flat.copy_(host[:total], non_blocking=True)
            if self.device.type == "cuda":
                event = torch.cuda.Event()
                event.record()
                self.events[self.turn] = event
        self.turn ^= 1
        # views only where needed: a view per array costs more than the copy at decode sizes
        return [t if a.ndim == 1 else t.view(a.shape) for t, a in zip(flat.split(sizes), arrays, strict=True)]


class MetadataBuilder:
    """Builds a StepMetadata per forward into persistent buffers (one per runtime and cache)."""

    def __init__(self, geometry: StepGeometry, device: torch.device | str) -> None:
        self.geo = geometry
        self.staging = Staging(torch.device(device))

    def build(
        self,
        batch: ForwardBatch,
        last_layer_is_consumer: bool,
        fixed: FixedShape | None = None,
        staging: Staging | None = None,
    ) -> StepMetadata:
        """The step's metadata, uploaded through `staging` (default: the builder's own); with `fixed`,
        padded to that shape (a batch of only padding sequences is then allowed)."""
        geo = self.geo
        segs = list(batch.segments)
        if not segs and fixed is None:
            raise ValueError("a forward needs at least one segment")
        for s in segs:
            if not s.token_ids:
                raise ValueError(f"segment of slot {s.slot} has no tokens")
        slots = np.array([s.slot for s in segs], dtype=np.int64)
        if len(set(slots.tolist())) != len(segs):
            raise ValueError(f"a forward may hold each slot once, got slots {slots.tolist()}")
        if (slots <= 0).any() or (slots >= geo.num_slots).any():
            raise ValueError(f"slots must lie in [1, {geo.num_slots}), got {slots.tolist()}")
        if fixed is not None:
            self._check_fixed(segs, fixed)
            pad = SequenceSegment(0, [0], 0, [0] * fixed.tokens, fixed.logits)
            segs += [pad] * (fixed.num_seqs - len(segs))
            slots = np.array([s.slot for s in segs], dtype=np.int64)
        start = np.array([s.start_pos for s in segs], dtype=np.int64)
        lens = np.array([len(s.token_ids) for s in segs], dtype=np.int64)
        end = start + lens
        qsl = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
        max_blocks = max(len(s.block_table) for s in segs)
        width = fixed.table_width if fixed else 1 << max(max_blocks - 1, 0).bit_length()
        tables = np.zeros((len(segs), width), dtype=np.int64)
        for i, s in enumerate(segs):
            tables[i, : len(s.block_table)] = s.block_table
        needed = -(-end // BLOCK_TOKENS)
        short = [s.slot for s, n in zip(segs, needed, strict=True) if len(s.block_table) < n]
        if short:
            raise ValueError(f"block tables of slots {short} do not cover their new positions")

        replay = geo.replay
        consumer_from = np.maximum(end - replay.keep, 0) if replay.mode != "off" else np.zeros_like(end)
        zero = np.zeros_like(start)
        arrays: dict[str, np.ndarray] = {
            "slots": slots, "seg_start": start, "seg_end": end, "qsl": qsl, "tables": tables,
            "consumer_from": consumer_from,
        }
        all_host = self._rows("all", start, start, end, slots, zero, arrays)
        consumer_host = all_host
        if replay.mode == "mask":
            consumer_host = self._rows("consumer", start, start, end, slots, consumer_from, arrays)
        elif replay.mode == "compact":
            first = np.maximum(start, consumer_from)
            consumer_host = self._rows("consumer", start, first, end, slots, consumer_from, arrays)
            arrays["kept"] = _ranges(qsl[:-1] + (first - start), qsl[1:])
        for ratio in geo.ratios:
            per_seq = -(-fixed.tokens // ratio) if fixed else None
            self._compression(ratio, start, end, slots, qsl, tables, arrays, per_seq)
        if geo.engram_n:
            self._engram(start, end, slots, qsl, arrays)
        last_bounds = consumer_host[0] if last_layer_is_consumer else all_host[0]
        picks, offsets = [], [0]
        for (b, e), s in zip(last_bounds, segs, strict=True):
            rows = range(b, e) if s.logits == "all" else [e - 1] if s.logits == "last" else []
            picks.extend(rows)
            offsets.append(offsets[-1] + len(rows))
        arrays["logits_rows"] = np.array(picks, dtype=np.int64)
        arrays["input_ids"] = np.fromiter((t for s in segs for t in s.token_ids), np.int64, int(qsl[-1]))

        names = list(arrays)
        t = dict(zip(names, (staging or self.staging).upload([arrays[n] for n in names]), strict=True))

        def row_set(prefix: str, host: tuple) -> RowSet:
            bounds, count = host
            return RowSet(count, bounds, t[f"{prefix}.positions"], t[f"{prefix}.row_seg"],
                          t[f"{prefix}.window"], t[f"{prefix}.ring_dest"], t[f"{prefix}.ring_src"])

        all_rows = row_set("all", all_host)
        consumer_rows = all_rows if consumer_host is all_host else row_set("consumer", consumer_host)
        compression = {}
        for r in geo.ratios:
            g = t.get
            capacity = width * (BLOCK_TOKENS // r) if fixed else int((end // r).max())
            compression[r] = Compression(
                r, capacity, arrays[f"c{r}.pool_dest"].size, t[f"c{r}.entry_positions"],
                t[f"c{r}.pool_dest"], g(f"c{r}.sources"), g(f"c{r}.state_dest"), g(f"c{r}.state_src"),
            )
        return StepMetadata(
            num_seqs=len(segs), num_rows=int(qsl[-1]), slots=t["slots"], seg_start=t["seg_start"],
            seg_end=t["seg_end"], query_start_loc=t["qsl"], block_tables=t["tables"],
            consumer_from=t["consumer_from"], all_rows=all_rows, consumer_rows=consumer_rows,
            kept=t.get("kept"), compression=compression, engram_sources=t.get("engram_sources"),
            history_dest=t.get("history_dest"), history_src=t.get("history_src"),
            input_ids=t["input_ids"], logits_rows=t["logits_rows"], row_offsets=offsets,
        )

    def _rows(
        self, prefix: str, start: np.ndarray, first: np.ndarray, end: np.ndarray, slots: np.ndarray,
        lo: np.ndarray, arrays: dict[str, np.ndarray],
    ) -> tuple[tuple[tuple[int, int], ...], int]:
        """Rows at positions [first, end) of each sequence; window keys at or after `lo` only."""
        geo = self.geo
        w, ring = geo.window, geo.ring_len
        n = end - first
        begin = np.concatenate(([0], np.cumsum(n)[:-1])).astype(np.int64)
        pos = _ranges(first, end)
        seg = np.repeat(np.arange(len(n)), n)
        keys = pos[:, None] - w + 1 + np.arange(w)  # [rows, W]
        s = seg[:, None]
        from_ring = keys < start[s]
        ring_row = slots[s] * ring + keys % ring
        current = geo.num_slots * ring + begin[s] + keys - first[s]
        valid = (keys >= np.maximum(lo[s], 0)) & (from_ring | (keys >= first[s]))
        arrays[f"{prefix}.positions"] = pos
        arrays[f"{prefix}.row_seg"] = seg
        arrays[f"{prefix}.window"] = np.where(valid, np.where(from_ring, ring_row, current), -1)
        stored = (pos >= lo[seg]) & (pos >= end[seg] - ring)  # newer rows would overwrite older ones
        arrays[f"{prefix}.ring_dest"] = (slots[seg] * ring + pos % ring)[stored]
        arrays[f"{prefix}.ring_src"] = np.flatnonzero(stored).astype(np.int64)
        bounds = tuple(zip(begin.tolist(), (begin + n).tolist(), strict=True))
        return bounds, int(n.sum())

    def _compression(
        self, r: int, start: np.ndarray, end: np.ndarray, slots: np.ndarray, qsl: np.ndarray,
        tables: np.ndarray, arrays: dict[str, np.ndarray], per_seq: int | None = None,
    ) -> None:
        """Groups completed by this step: entries [start // r, end // r) of each sequence.

        per_seq (fixed shapes): each sequence owns that many entry places, its entries first; the rest
        are padding entries (position 0, pool row 0 of the padding block, pooled from step row 0).
        """
        geo, per_block = self.geo, BLOCK_TOKENS // r
        counts = end // r - start // r
        entries = _ranges(start // r, end // r)
        seg = np.repeat(np.arange(len(counts)), counts)
        place = None if per_seq is None else seg * per_seq + entries - (start // r)[seg]

        def put(name: str, values: np.ndarray, fill: int) -> None:
            if place is not None:
                padded = np.full((len(counts) * per_seq, *values.shape[1:]), fill, dtype=np.int64)
                padded[place] = values
                values = padded
            arrays[name] = values

        put(f"c{r}.entry_positions", entries * r, 0)
        put(f"c{r}.pool_dest", tables[seg, entries // per_block] * per_block + entries % per_block, 0)
        if r == 1:
            return
        lc = geo.state_lens[r]
        group = entries[:, None] * r + np.arange(r)  # [M, r] positions
        s = seg[:, None]
        in_step = geo.num_slots * lc + qsl[s] + group - start[s]
        put(f"c{r}.sources", np.where(group >= start[s], in_step, slots[s] * lc + group % lc),
            geo.num_slots * lc)
        rows = np.arange(qsl[-1])
        row_seg = np.repeat(np.arange(len(counts)), end - start)
        pos = start[row_seg] + rows - qsl[row_seg]
        kept = pos >= end[row_seg] - lc
        arrays[f"c{r}.state_dest"] = (slots[row_seg] * lc + pos % lc)[kept]
        arrays[f"c{r}.state_src"] = rows[kept]

    def _check_fixed(self, segs: list[SequenceSegment], fixed: FixedShape) -> None:
        if len(segs) > fixed.num_seqs:
            raise ValueError(f"{len(segs)} sequences do not fit a fixed shape of {fixed.num_seqs}")
        if fixed.tokens > self.geo.max_fixed_tokens:
            raise ValueError(f"a fixed shape holds at most {self.geo.max_fixed_tokens} tokens per sequence, "
                             f"got {fixed.tokens}")
        for s in segs:
            same_rows = s.logits == fixed.logits or (fixed.tokens == 1 and s.logits != "none")
            if len(s.token_ids) != fixed.tokens or not same_rows:
                raise ValueError(f"segment of slot {s.slot} ({len(s.token_ids)} tokens, logits {s.logits!r}) "
                                 f"does not fit the fixed shape {fixed}")
            if len(s.block_table) > fixed.table_width:
                raise ValueError(f"block table of slot {s.slot} is wider than {fixed.table_width}")

    def _engram(
        self, start: np.ndarray, end: np.ndarray, slots: np.ndarray, qsl: np.ndarray,
        arrays: dict[str, np.ndarray],
    ) -> None:
        """N-gram token sources per row (shift i = token at position p - i) and the history update."""
        geo, hl = self.geo, self.geo.history_len
        rows = np.arange(qsl[-1])
        seg = np.repeat(np.arange(len(start)), end - start)
        pos = start[seg] + rows - qsl[seg]
        back = pos[:, None] - np.arange(geo.engram_n)  # [T, N] positions
        s = seg[:, None]
        in_step = geo.num_slots * hl + rows[:, None] - np.arange(geo.engram_n)
        src = np.where(back >= start[s], in_step, slots[s] * hl + back % hl)
        arrays["engram_sources"] = np.where(back >= 0, src, -1)
        kept = pos >= end[seg] - hl
        arrays["history_dest"] = (slots[seg] * hl + pos % hl)[kept]
        arrays["history_src"] = rows[kept]
