"""StepMetadata: the flat per-step tensors every layer op reads, built once per forward on the host.

The builder turns the engine's ForwardBatch (Python lists) into index arrays with numpy, packs them
into one persistent int64 staging buffer (pinned on accelerators, double-buffered so the next build
never overwrites a copy still in flight) and copies it to a persistent device buffer with one
non-blocking copy. The forward then sees only tensors, plus host ints derived from the lists (row
counts, capacities). Row sets, index conventions and the meaning of each field: docs/architecture.md.

Block tables are kept per slot (SlotTables): a step copies only the entries a sequence appended since
its last step, not its whole list.

A build for a `FixedShape` (CUDA graphs, graphs.py) pads the batch with padding sequences (slot 0,
block table of block 0, both reserved for padding) and pads every data-dependent count to its bound,
so every tensor shape and host int is a function of the shape alone; the padding writes only to
slot 0's rings and block 0. Such a build follows a per-shape plan (FixedPlan): every array has a fixed
place in the staging buffer, the values that depend on the shape alone are written once, the rest is
computed over [sequences, tokens] arrays straight into the buffer, and the StepMetadata (views of the
buffer) is made once per buffer and returned again by every later build.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Literal, NamedTuple

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
    visible[r] [n]: compressed entries of ratio r that each row sees (complete groups up to its token),
    (position + 1) // r.
    """

    count: int
    bounds: tuple[tuple[int, int], ...] | None  # host: each sequence's [begin, end) rows (None: device build)
    positions: torch.Tensor
    row_seg: torch.Tensor
    window: torch.Tensor
    ring_dest: torch.Tensor
    ring_src: torch.Tensor
    visible: dict[int, torch.Tensor]


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
    row_offsets: list[int] | None  # host: first logits row of each sequence (len B + 1); None: device build


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Concatenation of arange(starts[i], ends[i])."""
    if len(starts) == 1:
        return np.arange(int(starts[0]), int(ends[0]), dtype=np.int64)
    lens = ends - starts
    total = int(lens.sum())
    firsts = np.cumsum(lens) - lens
    return np.arange(total, dtype=np.int64) - np.repeat(firsts - starts, lens)


def _floor_div(a: np.ndarray, d: int) -> np.ndarray:
    """a // d of non-negative a: a shift when d is a power of two (int64 division does not vectorise)."""
    return a >> (d.bit_length() - 1) if d & (d - 1) == 0 else a // d


def _remainder(a: np.ndarray, d: int) -> np.ndarray:
    """a % d of non-negative a."""
    return a & (d - 1) if d & (d - 1) == 0 else a % d


def _spread(base: np.ndarray, step: int, width: int) -> np.ndarray:
    """[len(base), width]: base + step * j in column j; narrow ones column by column (numpy's broadcast
    over a short inner axis runs an inner loop per row: 2-8x slower at 2048 x 4)."""
    if width > 8:
        return base[:, None] + step * np.arange(width)
    out = np.empty((base.size, width), dtype=np.int64)
    for j in range(width):
        np.add(base, step * j, out=out[:, j])
    return out


class _Layout(NamedTuple):
    """Rows at positions [first, end) of each sequence, packed in sequence order."""

    n: np.ndarray  # rows per sequence
    begin: np.ndarray  # first row of each sequence
    seg: np.ndarray  # each row's sequence
    pos: np.ndarray  # each row's position
    count: int

    @classmethod
    def of(cls, first: np.ndarray, end: np.ndarray) -> _Layout:
        n = end - first
        count = int(n.sum())
        if len(n) == 1:
            pos = np.arange(int(first[0]), int(end[0]), dtype=np.int64)
            return cls(n, np.zeros(1, dtype=np.int64), np.zeros(count, dtype=np.int64), pos, count)
        begin = np.cumsum(n) - n
        seg = np.repeat(np.arange(len(n)), n)
        return cls(n, begin, seg, np.arange(count, dtype=np.int64) + (first - begin)[seg], count)


def _suffix(
    stored_from: np.ndarray, first: np.ndarray, layout: _Layout, end: np.ndarray, slots: np.ndarray,
    ring: int,
) -> tuple[np.ndarray, np.ndarray]:
    """A ring's update by the rows at positions [stored_from, end) of each sequence (of the row set laid
    out from `first` by `layout`): ring rows slot * ring + position % ring, and the set's rows written
    there."""
    if len(end) == 1:
        positions = np.arange(int(stored_from[0]), int(end[0]), dtype=np.int64)
        return positions % ring + int(slots[0]) * ring, positions - int(first[0])
    if int(stored_from.sum()) == int(first.sum()):  # every row (stored_from >= first): short steps
        return layout.pos % ring + (slots * ring)[layout.seg], np.arange(layout.count, dtype=np.int64)
    kept = end - stored_from
    positions = _ranges(stored_from, end)
    s = np.repeat(np.arange(len(kept)), kept)
    return positions % ring + (slots * ring)[s], positions + (layout.begin - first)[s]


_PAD = np.zeros(1, dtype=np.int64)
# eager builds with at least this many window keys (all rows' W) gather the windows on the device from the
# shipped line (`MetadataBuilder._rows`; a 2048-token prefill at W 128: 2 MiB less to build, pack and copy
# before the step's first kernel)
DEVICE_WINDOW_KEYS = 1 << 16


def _entry_positions(t: dict[str, torch.Tensor], r: int) -> torch.Tensor:
    """Compression.entry_positions of ratio r: at ratio 1 the positions of all rows, the same tensor (so
    RoPE angles computed for the rows serve the new entries too: StepState.angles)."""
    return t["all.positions"] if r == 1 else t[f"c{r}.entry_positions"]


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
        self.host_np: list[np.ndarray] = [h.numpy() for h in self.host]
        self.events: list[torch.cuda.Event | None] = [None, None]
        self.dev = torch.empty(0, dtype=torch.int64, device=device)
        self.turn = 0
        self.writer: list[object] = [None, None]  # per host buffer: the FixedPlan that wrote it last

    def upload(self, arrays: list[np.ndarray]) -> list[torch.Tensor]:
        # each array starts 16-byte aligned (one unused value after an odd count): Triton specialises
        # kernels on pointer alignment, so packed arrays would compile new kernels as sizes change
        sizes = [n for a in arrays for n in (a.size, a.size % 2)]  # each array, then its padding
        total = sum(sizes)
        host, _ = self.acquire(total, None)
        if total:
            np.concatenate([p for a in arrays for p in ((a.ravel(), _PAD) if a.size % 2 else (a.ravel(),))],
                           out=host[:total])
        flat = self.send(total)
        # views only where needed: a view per array costs more than the copy at decode sizes
        pieces = flat.split(sizes)[::2]
        return [t if a.ndim == 1 else t.view(a.shape) for t, a in zip(pieces, arrays, strict=True)]

    def acquire(self, total: int, writer: object) -> tuple[np.ndarray, bool]:
        """The host buffer of the next upload (at least `total` values), once the copy that last read
        it is done, and whether `writer` wrote it last (then what only `writer` writes is still there)."""
        turn = self.turn
        if self.events[turn] is not None:
            self.events[turn].synchronize()  # the copy that last read this buffer is done
        if self.host[turn].numel() < total:
            capacity = 1 << max(total, 1024).bit_length()
            self.host[turn] = torch.empty(capacity, dtype=torch.int64, pin_memory=self.pinned)
            self.host_np[turn] = self.host[turn].numpy()
            self.writer[turn] = None
        held = writer is not None and self.writer[turn] is writer
        self.writer[turn] = writer
        return self.host_np[turn], held

    def send(self, total: int) -> torch.Tensor:
        """Ship the first `total` values of the acquired host buffer: the device values (the host
        buffer itself on the CPU unless persistent); the next upload uses the other host buffer."""
        host = self.host[self.turn]
        if self.device.type == "cpu" and not self.persistent:
            flat = host[:total]
        else:
            if self.dev.numel() < total:
                if self.persistent and self.dev.numel():
                    raise RuntimeError(f"persistent staging holds {self.dev.numel()} values, got {total}")
                capacity = 1 << max(total, 1024).bit_length()
                self.dev = torch.empty(capacity, dtype=torch.int64, device=self.device)
            flat = self.dev[:total]
            flat.copy_(host[:total], non_blocking=True)
            if self.device.type == "cuda":
                event = torch.cuda.Event()
                event.record()
                self.events[self.turn] = event
        self.turn ^= 1
        return flat


class SlotTables:
    """Each slot's block table as a row of one numpy array, updated only where its list changed.

    A list is recognised by identity: passed again for the same slot, it is taken to have changed
    only by appends (the engine's contract: scheduler.ScheduledSegment.blocks is appended to or
    replaced, never rewritten), so only the new entries are copied; any other list is copied whole.
    Entries past a row's length are 0 (the padding block), as in a padded table.
    """

    def __init__(self, num_slots: int) -> None:
        self.rows = np.zeros((num_slots, 64), dtype=np.int64)
        self.lists: list[object] = [None] * num_slots
        self.lens = [0] * num_slots

    def update(self, slot: int, table: list[int]) -> int:
        """Make row `slot` hold `table`; its length."""
        n, k = len(table), self.lens[slot]
        if table is self.lists[slot] and n >= k:
            if n > k:
                self.reserve(n)
                self.rows[slot, k:n] = table[k:]
                self.lens[slot] = n
            return n
        self.reserve(n)
        row = self.rows[slot]
        row[:n] = table
        if k > n:
            row[n:k] = 0
        self.lists[slot], self.lens[slot] = table, n
        return n

    def update_segments(self, segs: list[SequenceSegment]) -> list[int]:
        """`update` for each segment's slot and table; the lengths. The common decode case (the same,
        unchanged list) is checked here, without a method call per sequence."""
        lists, lens, update = self.lists, self.lens, self.update
        return [lens[s.slot] if s.block_table is lists[s.slot] and len(s.block_table) == lens[s.slot]
                else update(s.slot, s.block_table) for s in segs]

    def reserve(self, width: int) -> None:
        if width > self.rows.shape[1]:
            grown = np.zeros((self.rows.shape[0], 1 << (width - 1).bit_length()), dtype=np.int64)
            grown[:, : self.rows.shape[1]] = self.rows
            self.rows = grown


def _check_segments(segs: list[SequenceSegment], num_slots: int) -> list[int]:
    """Each segment's slot, once checked: tokens present, each slot once, in [1, num_slots)."""
    slots = [s.slot for s in segs]
    for s in segs:
        if not s.token_ids:
            raise ValueError(f"segment of slot {s.slot} has no tokens")
    if len(set(slots)) != len(segs):
        raise ValueError(f"a forward may hold each slot once, got slots {slots}")
    if slots and (min(slots) <= 0 or max(slots) >= num_slots):
        raise ValueError(f"slots must lie in [1, {num_slots}), got {slots}")
    return slots


def window_ring_keys(geo: StepGeometry, n: int) -> np.ndarray:
    """[L, n, W]: (start + j - W + 1 + w) mod L by start mod L, the ring entries of every window key."""
    offsets = np.arange(n)[:, None] - geo.window + 1 + np.arange(geo.window)
    return (np.arange(geo.ring_len)[:, None, None] + offsets) % geo.ring_len


class FixedPlan:
    """The metadata of one FixedShape: each array's place in the staging buffer, the arrays that
    depend on the shape alone, and index templates over [sequence, token(, key)] (module docstring).

    B sequences (real ones first, then padding ones: slot 0, position 0, table of block 0) of n tokens
    each: row r = b * n + j holds position start_b + j. Window key w of that row is position
    start_b + j - W + 1 + w: from the slot's ring when j - W + 1 + w < 0, else step row b * n + (key -
    start_b); counts that depend on data elsewhere (ring rows kept, compressed entries) are at their
    bounds, because n <= StepGeometry.max_fixed_tokens.
    """

    def __init__(self, geo: StepGeometry, shape: FixedShape, ring_keys: np.ndarray) -> None:
        """`ring_keys`: window_ring_keys(geo, shape.tokens), shared by the plans of one n."""
        self.geo, self.shape, self.ring_keys = geo, shape, ring_keys
        b, n, w = shape.num_seqs, shape.tokens, geo.window
        rows = b * n
        seq = np.arange(b, dtype=np.int64)
        row_seg = np.repeat(seq, n)
        every_row = np.arange(rows, dtype=np.int64)
        self.tok = np.arange(n, dtype=np.int64)
        self.key_offsets = self.tok[:, None] - w + 1 + np.arange(w)  # [n, W]: key - start
        self.seq_rows = seq * n  # each sequence's first row
        self.first_rows = geo.num_slots * geo.ring_len + self.seq_rows  # window key of its start
        self.table_rows = seq * shape.table_width  # each sequence's first entry of the flat tables
        self.layout: list[tuple[str, tuple[int, ...]]] = []
        self.view_shapes: dict[str, tuple[int, ...]] = {}
        self.constants: dict[str, np.ndarray] = {}

        def add(name: str, *dims: int, value: np.ndarray | None = None, per: int = 0) -> None:
            """`per`: the array holds `per` rows (or entry places) per sequence; `fill` sees [B, per, ...]."""
            self.layout.append((name, dims))
            self.view_shapes[name] = (b, per, *dims[1:]) if per else dims
            if value is not None:
                self.constants[name] = value.reshape(self.view_shapes[name])

        mode = geo.replay.mode
        add("slots", b)
        add("seg_start", b)
        add("seg_end", b)
        add("qsl", b + 1, value=np.arange(b + 1, dtype=np.int64) * n)
        add("tables", b, shape.table_width)
        add("consumer_from", b, value=np.zeros(b, dtype=np.int64) if mode == "off" else None)
        add("all.positions", rows, per=n)
        add("all.row_seg", rows, value=row_seg)
        add("all.window", rows, w, per=n)
        add("all.ring_dest", rows, per=n)
        add("all.ring_src", rows, value=every_row)
        for r in geo.ratios:
            add(f"all.visible{r}", rows, per=n)
        if mode != "off":
            add("consumer.window", rows, w, per=n)
        if mode == "compact":
            add("kept", rows, value=every_row)
        self.per_seq: dict[int, int] = {}
        for r in geo.ratios:
            self.per_seq[r] = p = -(-n // r)
            add(f"c{r}.pool_dest", b * p, per=p)
            if r > 1:
                add(f"c{r}.entry_positions", b * p, per=p)
                add(f"c{r}.sources", b * p, r, per=p)
                add(f"c{r}.state_dest", rows, per=n)
                add(f"c{r}.state_src", rows, value=every_row)
        if geo.engram_n:
            shifts = np.arange(geo.engram_n)
            self.history_in_step = self.tok[:, None] - shifts >= 0  # [n, N]: shifts within the segment
            self.history_step = geo.num_slots * geo.history_len + every_row.reshape(b, n, 1) - shifts
            add("engram_sources", rows, geo.engram_n, per=n)
            add("history_dest", rows, per=n)
            add("history_src", rows, value=every_row)
        last = shape.logits == "last"
        logits_rows = seq * n + n - 1 if last else every_row
        add("logits_rows", len(logits_rows), value=logits_rows)
        add("input_ids", rows)
        self.places: dict[str, tuple[int, int, tuple[int, ...]]] = {}
        at = 0
        for name, dims in self.layout:
            size = int(np.prod(dims))
            self.places[name] = (at, at + size, dims)
            at += size + size % 2  # 16-byte aligned places, as Staging.upload's (why: there)
        self.total = at
        self.bounds = tuple((i * n, (i + 1) * n) for i in range(b))
        self.row_offsets = [i * (n if not last else 1) for i in range(b + 1)]
        self._views: dict[int, tuple[np.ndarray, dict[str, np.ndarray]]] = {}
        self._metas: dict[int, tuple[torch.Tensor, StepMetadata]] = {}

    def views(self, host: np.ndarray) -> dict[str, np.ndarray]:
        """Views of each array's place in `host` (kept per buffer), shaped as `fill` computes them:
        per-row arrays as [B, n(, ...)], per-entry-place arrays as [B, places(, r)]."""
        hit = self._views.get(id(host))  # the entry holds `host`: its id stays unique
        if hit is None:
            if len(self._views) >= 4:
                self._views.clear()
            hit = (host, {n: host[a:e].reshape(self.view_shapes[n]) for n, (a, e, _) in self.places.items()})
            self._views[id(host)] = hit
        return hit[1]

    def metadata(self, flat: torch.Tensor) -> StepMetadata:
        """The StepMetadata viewing the uploaded buffer `flat` (made once per buffer)."""
        key = flat.data_ptr()
        hit = self._metas.get(key)
        if hit is None:
            if len(self._metas) >= 4:
                self._metas.clear()
            hit = (flat, self._make_metadata(flat))
            self._metas[key] = hit
        return hit[1]

    def _make_metadata(self, flat: torch.Tensor) -> StepMetadata:
        t = {n: flat[a:e].view(d) for n, (a, e, d) in self.places.items()}
        geo, shape = self.geo, self.shape
        rows = shape.num_seqs * shape.tokens

        def row_set(window: torch.Tensor) -> RowSet:
            return RowSet(rows, self.bounds, t["all.positions"], t["all.row_seg"], window, t["all.ring_dest"],
                          t["all.ring_src"], {r: t[f"all.visible{r}"] for r in geo.ratios})

        all_rows = row_set(t["all.window"])
        consumer_rows = all_rows if geo.replay.mode == "off" else row_set(t["consumer.window"])
        compression = {
            r: Compression(r, shape.table_width * (BLOCK_TOKENS // r), shape.num_seqs * self.per_seq[r],
                           _entry_positions(t, r), t[f"c{r}.pool_dest"], t.get(f"c{r}.sources"),
                           t.get(f"c{r}.state_dest"), t.get(f"c{r}.state_src"))
            for r in geo.ratios
        }
        return StepMetadata(
            num_seqs=shape.num_seqs, num_rows=rows, slots=t["slots"], seg_start=t["seg_start"],
            seg_end=t["seg_end"], query_start_loc=t["qsl"], block_tables=t["tables"],
            consumer_from=t["consumer_from"], all_rows=all_rows, consumer_rows=consumer_rows,
            kept=t.get("kept"), compression=compression, engram_sources=t.get("engram_sources"),
            history_dest=t.get("history_dest"), history_src=t.get("history_src"),
            input_ids=t["input_ids"], logits_rows=t["logits_rows"], row_offsets=list(self.row_offsets),
        )

    def fill(self, v: dict[str, np.ndarray], slots: list[int], starts: list[int], tables: SlotTables,
             ids: list[int]) -> None:
        """Write every per-step array into the views `v`: the real sequences' `slots`, `starts` and
        token `ids`, then padding sequences."""
        geo, shape = self.geo, self.shape
        n, ring, real = shape.tokens, geo.ring_len, len(slots)
        slot, start = v["slots"], v["seg_start"]
        slot[:real], slot[real:] = slots, 0
        start[:real], start[real:] = starts, 0
        np.add(start, n, out=v["seg_end"])
        np.take(tables.rows[:, : shape.table_width], slot, axis=0, out=v["tables"], mode="clip")
        pos = np.add(start[:, None], self.tok, out=v["all.positions"])  # [B, n]
        self._window(v)
        np.add(pos % ring, (slot * ring)[:, None], out=v["all.ring_dest"])
        for r in geo.ratios:
            np.floor_divide(pos + 1, r, out=v[f"all.visible{r}"])
            self._compression(v, r, pos)
        if geo.engram_n:
            self._engram(v, pos)
        out = v["input_ids"]
        out[: len(ids)], out[len(ids):] = ids, 0

    def _window(self, v: dict[str, np.ndarray]) -> None:
        geo, n, ring = self.geo, self.shape.tokens, self.geo.ring_len
        slot, start, end = v["slots"], v["seg_start"], v["seg_end"]
        window, offsets, w = v["all.window"], self.key_offsets, geo.window
        np.take(self.ring_keys, start % ring, axis=0, out=window, mode="clip")  # keys % L
        window += (slot * ring)[:, None, None]
        for j in range(n):  # keys at or after the start are this step's rows
            np.add(self.first_rows[:, None], offsets[j, w - 1 - j:], out=window[:, j, w - 1 - j:])
        if geo.replay.mode != "off":
            lo = np.maximum(end - geo.replay.keep, 0, out=v["consumer_from"])
            consumer = v["consumer.window"]
            np.copyto(consumer, window)
            np.copyto(consumer, -1, where=start[:, None, None] + offsets < lo[:, None, None])
        young = np.flatnonzero(start < w - 1)  # windows reaching back before position 0 (padding too)
        if young.size:
            rows = window[young]
            np.copyto(rows, -1, where=start[young, None, None] + offsets < 0)
            window[young] = rows

    def _engram(self, v: dict[str, np.ndarray], pos: np.ndarray) -> None:
        """N-gram token sources (shift i: position p - i, from this step or the history ring) and the
        history ring rows this step's ids go to."""
        hl, slot = self.geo.history_len, v["slots"]
        back = pos[:, :, None] - np.arange(self.geo.engram_n)  # [B, n, N] positions
        src = v["engram_sources"]
        np.remainder(back, hl, out=src)
        src += (slot * hl)[:, None, None]
        np.copyto(src, self.history_step, where=self.history_in_step)
        np.copyto(src, -1, where=back < 0)
        np.add(pos % hl, (slot * hl)[:, None], out=v["history_dest"])

    def _compression(self, v: dict[str, np.ndarray], r: int, pos: np.ndarray) -> None:
        """Entry place j of sequence b holds entry start_b // r + j if that group completes in this
        step, else a padding entry (position 0, pool row 0, pooled from the padding ring row)."""
        geo, width = self.geo, self.shape.table_width
        slot, start, end = v["slots"], v["seg_start"], v["seg_end"]
        p, per_block = self.per_seq[r], BLOCK_TOKENS // r
        dest = v[f"c{r}.pool_dest"]
        if r == 1:  # every row completes its own entry (at the row's position: `_entry_positions`)
            col = pos // per_block + self.table_rows[:, None]
            np.take(v["tables"].ravel(), col, out=dest, mode="clip")
            dest *= per_block
            dest += pos % per_block
            return
        entries = (start // r)[:, None] + np.arange(p)  # [B, p]
        pending = entries >= (end // r)[:, None]
        positions = v[f"c{r}.entry_positions"]
        np.multiply(entries, r, out=positions)
        np.copyto(positions, 0, where=pending)
        col = np.minimum(entries // per_block, width - 1) + self.table_rows[:, None]
        np.take(v["tables"].ravel(), col, out=dest, mode="clip")
        dest *= per_block
        dest += entries % per_block
        np.copyto(dest, 0, where=pending)
        lc = geo.state_lens[r]
        group = entries[:, :, None] * r + np.arange(r)  # [B, p, r] positions
        sources = v[f"c{r}.sources"]
        np.remainder(group, lc, out=sources)
        sources += (slot * lc)[:, None, None]
        step_rows = group + (geo.num_slots * lc + self.seq_rows - start)[:, None, None]
        np.copyto(sources, step_rows, where=group >= start[:, None, None])
        np.copyto(sources, geo.num_slots * lc, where=pending[:, :, None])
        np.add(pos % lc, (slot * lc)[:, None], out=v[f"c{r}.state_dest"])


class MetadataBuilder:
    """Builds a StepMetadata per forward into persistent buffers (one per runtime and cache)."""

    def __init__(self, geometry: StepGeometry, device: torch.device | str) -> None:
        self.geo = geometry
        self.staging = Staging(torch.device(device))
        self.tables = SlotTables(geometry.num_slots)
        self.plans: dict[FixedShape, FixedPlan] = {}
        self.ring_keys: dict[int, np.ndarray] = {}  # tokens per sequence -> window_ring_keys
        ring = geometry.ring_len
        self.wrap = np.arange(ring + geometry.window, dtype=np.int64) % ring  # i -> i mod L, i < L + W

    def build(
        self,
        batch: ForwardBatch,
        last_layer_is_consumer: bool,
        fixed: FixedShape | None = None,
        staging: Staging | None = None,
    ) -> StepMetadata:
        """The step's metadata, uploaded through `staging` (default: the builder's own); with `fixed`,
        padded to that shape (a batch of only padding sequences is then allowed), and the same
        StepMetadata object as the last build of that shape into the same buffer, values rewritten."""
        if fixed is not None:
            return self._build_fixed(batch.segments, fixed, staging or self.staging)
        geo = self.geo
        segs = list(batch.segments)
        if not segs:
            raise ValueError("a forward needs at least one segment")
        slots = np.array(_check_segments(segs, geo.num_slots), dtype=np.int64)
        start = np.array([s.start_pos for s in segs], dtype=np.int64)
        lens = np.array([len(s.token_ids) for s in segs], dtype=np.int64)
        end = start + lens
        qsl = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
        table_lens = np.array(self.tables.update_segments(segs), dtype=np.int64)
        short = slots[table_lens * BLOCK_TOKENS < end]
        if short.size:
            raise ValueError(f"block tables of slots {short.tolist()} do not cover their new positions")
        width = 1 << max(int(table_lens.max()) - 1, 0).bit_length()
        self.tables.reserve(width)
        tables = self.tables.rows[slots, :width]

        replay = geo.replay
        consumer_from = np.maximum(end - replay.keep, 0) if replay.mode != "off" else np.zeros_like(end)
        zero = np.zeros_like(start)
        arrays: dict[str, np.ndarray] = {
            "slots": slots, "seg_start": start, "seg_end": end, "qsl": qsl, "tables": tables,
            "consumer_from": consumer_from,
        }
        # every step row once: its sequence and position (shared by the row sets, compression, Engram)
        layout = _Layout.of(start, end)
        all_host = self._rows("all", start, start, end, slots, zero, arrays, layout)
        consumer_host = all_host
        if replay.mode == "mask":
            consumer_host = self._rows("consumer", start, start, end, slots, consumer_from, arrays, layout)
        elif replay.mode == "compact":
            first = np.maximum(start, consumer_from)
            consumer_host = self._rows("consumer", start, first, end, slots, consumer_from, arrays,
                                       _Layout.of(first, end))
            arrays["kept"] = _ranges(qsl[:-1] + (first - start), qsl[1:])
        for ratio in geo.ratios:
            self._compression(ratio, start, end, slots, tables, arrays, layout)
        if geo.engram_n:
            self._engram(start, end, slots, arrays, layout)
        last_bounds, _, last_end = consumer_host if last_layer_is_consumer else all_host
        # logits rows: each sequence's rows [pick_from, end) of the last layer's row set
        if all(s.logits == "last" for s in segs):
            arrays["logits_rows"], offsets = last_end - 1, list(range(len(segs) + 1))
        else:
            pick_from = np.array([b if s.logits == "all" else e - 1 if s.logits == "last" else e
                                  for (b, e), s in zip(last_bounds, segs, strict=True)], dtype=np.int64)
            arrays["logits_rows"] = _ranges(pick_from, last_end)
            offsets = [0, *np.cumsum(last_end - pick_from).tolist()]
        ids = segs[0].token_ids if len(segs) == 1 else chain.from_iterable(s.token_ids for s in segs)
        arrays["input_ids"] = np.fromiter(ids, np.int64, layout.count)

        names = list(arrays)
        t = dict(zip(names, (staging or self.staging).upload([arrays[n] for n in names]), strict=True))

        def row_set(prefix: str, host: tuple) -> RowSet:
            bounds, count, _ = host
            window = t.get(f"{prefix}.window")
            if window is None:
                window = self._device_window(t[f"{prefix}.window_line"], t.get(f"{prefix}.window_from"))
            return RowSet(count, bounds, t[f"{prefix}.positions"], t[f"{prefix}.row_seg"], window,
                          t[f"{prefix}.ring_dest"], t[f"{prefix}.ring_src"],
                          {r: t[f"{prefix}.visible{r}"] for r in geo.ratios})

        all_rows = row_set("all", all_host)
        consumer_rows = all_rows if consumer_host is all_host else row_set("consumer", consumer_host)
        compression = {}
        for r in geo.ratios:
            g = t.get
            compression[r] = Compression(
                r, int((end // r).max()), arrays[f"c{r}.pool_dest"].size, _entry_positions(t, r),
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
        lo: np.ndarray, arrays: dict[str, np.ndarray], layout: _Layout,
    ) -> tuple[tuple[tuple[int, int], ...], int, np.ndarray]:
        """Rows at positions [first, end) of each sequence (`layout`); window keys at or after `lo` only.
        Host values: each sequence's [begin, end) rows, the count, the sequences' end rows."""
        geo = self.geo
        w, ring = geo.window, geo.ring_len
        n, begin, seg, pos, count = layout
        nseq = len(n)
        # A window entry depends on its key's position alone (per sequence): -1 before lo or position 0,
        # ring row slot * L + key % L before start, -1 in [start, first), else S * L + the key's row of
        # this set. Each sequence's values form a line: its W - 1 keys before `first`, then one per row;
        # the window of row r is the W line entries from line_from[r] = r + sequence * (W - 1).
        lead = np.arange(w - 1)
        kept = (lead >= (np.maximum(lo, 0) - first + w - 1)[:, None]) & (
            lead < (start - first + w - 1)[:, None])
        ring_rows = (slots * ring)[:, None] + self.wrap[((first - w + 1) % ring)[:, None] + lead]
        before = np.where(kept, ring_rows, -1)  # [sequences, W - 1]
        step_key = geo.num_slots * ring
        current = np.arange(step_key, step_key + count, dtype=np.int64)
        if (lo > first).any():
            current[pos < lo[seg]] = -1
        if nseq == 1:
            line, line_from = np.concatenate((before[0], current)), None
        else:
            line_from = np.arange(count, dtype=np.int64) + seg * (w - 1)
            line = np.empty(count + nseq * (w - 1), dtype=np.int64)
            line[line_from + (w - 1)] = current
            line[(begin + np.arange(nseq) * (w - 1))[:, None] + lead] = before
        if count * w < DEVICE_WINDOW_KEYS:
            keys = np.ndarray((line.size - w + 1, w), np.int64, line, strides=(8, 8))  # sliding view
            arrays[f"{prefix}.window"] = keys.copy() if line_from is None else keys[line_from]
        else:  # long steps: the host ships the line, the device gathers the windows (`_device_window`)
            arrays[f"{prefix}.window_line"] = line
            if line_from is not None:
                arrays[f"{prefix}.window_from"] = line_from
        arrays[f"{prefix}.positions"] = pos
        arrays[f"{prefix}.row_seg"] = seg
        # ring rows kept: at or after lo, and the last L positions (newer rows would overwrite older ones)
        stored_from = np.maximum(np.maximum(first, lo), end - ring)
        arrays[f"{prefix}.ring_dest"], arrays[f"{prefix}.ring_src"] = _suffix(
            stored_from, first, layout, end, slots, ring)
        after = pos + 1
        for r in geo.ratios:
            arrays[f"{prefix}.visible{r}"] = after if r == 1 else _floor_div(after, r)
        stop = begin + n
        return tuple(zip(begin.tolist(), stop.tolist(), strict=True)), count, stop

    def _device_window(self, line: torch.Tensor, line_from: torch.Tensor | None) -> torch.Tensor:
        """RowSet.window [count, W] gathered on the device from the uploaded line (`_rows`): one gather
        (one copy for a single sequence) instead of shipping count * W values."""
        windows = line.unfold(0, self.geo.window, 1)
        return windows.contiguous() if line_from is None else torch.index_select(windows, 0, line_from)

    def _compression(
        self, r: int, start: np.ndarray, end: np.ndarray, slots: np.ndarray, tables: np.ndarray,
        arrays: dict[str, np.ndarray], layout: _Layout,
    ) -> None:
        """Groups completed by this step: entries [start // r, end // r) of each sequence."""
        geo, per_block = self.geo, BLOCK_TOKENS // r
        n, begin, seg, pos, _ = layout  # all rows: begin = query_start_loc[:-1]
        nseq = len(n)
        if r == 1:
            entries, entry_seg, counts = pos, seg, n
        else:
            counts = end // r - start // r
            entries = _ranges(start // r, end // r)
            entry_seg = np.repeat(np.arange(nseq), counts) if nseq > 1 else None
        col = _floor_div(entries, per_block)
        if entry_seg is not None:
            col += entry_seg * tables.shape[1]
        dest = tables.ravel()[col]
        dest *= per_block
        dest += _remainder(entries, per_block)
        arrays[f"c{r}.pool_dest"] = dest
        if r == 1:  # entry positions are the rows' positions (`_entry_positions`)
            return
        positions = entries * r
        arrays[f"c{r}.entry_positions"] = positions
        lc = geo.state_lens[r]
        # position p of a group is step row begin + p - start (rows S * Lc on), or, before start (only in
        # each sequence's first group), compressor ring row slot * Lc + p % Lc
        step_row = geo.num_slots * lc + begin - start
        sources = _spread(positions + (step_row if entry_seg is None else step_row[entry_seg]), 1, r)
        straddle = (counts > 0) & (start % r != 0)
        if straddle.any():
            at = (np.cumsum(counts) - counts)[straddle]
            group = positions[at][:, None] + np.arange(r)
            from_ring = (slots[straddle] * lc)[:, None] + group % lc
            sources[at] = np.where(group >= start[straddle][:, None], sources[at], from_ring)
        arrays[f"c{r}.sources"] = sources
        arrays[f"c{r}.state_dest"], arrays[f"c{r}.state_src"] = _suffix(
            np.maximum(start, end - lc), start, layout, end, slots, lc)

    def _build_fixed(self, segs: list[SequenceSegment], fixed: FixedShape, staging: Staging) -> StepMetadata:
        geo, n = self.geo, fixed.tokens
        slots = _check_segments(segs, geo.num_slots)
        if len(segs) > fixed.num_seqs:
            raise ValueError(f"{len(segs)} sequences do not fit a fixed shape of {fixed.num_seqs}")
        if n > geo.max_fixed_tokens:
            raise ValueError(f"a fixed shape holds at most {geo.max_fixed_tokens} tokens per sequence, "
                             f"got {n}")
        if fixed.logits not in ("last", "all"):
            raise ValueError(f"a fixed shape returns 'last' or 'all' logits rows, got {fixed.logits!r}")
        starts, ids = [], []
        for s in segs:
            if len(s.token_ids) != n or (s.logits != fixed.logits and (n > 1 or s.logits == "none")):
                raise ValueError(f"segment of slot {s.slot} ({len(s.token_ids)} tokens, logits {s.logits!r}) "
                                 f"does not fit the fixed shape {fixed}")
            if len(s.block_table) > fixed.table_width:
                raise ValueError(f"block table of slot {s.slot} is wider than {fixed.table_width}")
            starts.append(s.start_pos)
            ids += s.token_ids
        short = [s.slot for s, width in zip(segs, self.tables.update_segments(segs), strict=True)
                 if width * BLOCK_TOKENS < s.start_pos + n]
        if short:
            raise ValueError(f"block tables of slots {short} do not cover their new positions")
        self.tables.reserve(fixed.table_width)
        plan = self.plans.get(fixed)
        if plan is None:
            if n not in self.ring_keys:
                self.ring_keys[n] = window_ring_keys(geo, n)
            plan = self.plans[fixed] = FixedPlan(geo, fixed, self.ring_keys[n])
        host, held = staging.acquire(plan.total, plan)
        views = plan.views(host)
        if not held:
            for name, value in plan.constants.items():
                views[name][...] = value
        plan.fill(views, slots, starts, self.tables, ids)
        return plan.metadata(staging.send(plan.total))

    def _engram(
        self, start: np.ndarray, end: np.ndarray, slots: np.ndarray, arrays: dict[str, np.ndarray],
        layout: _Layout,
    ) -> None:
        """N-gram token sources per row (shift i = token at position p - i) and the history update."""
        geo, hl = self.geo, self.geo.history_len
        n, begin, seg, pos, count = layout
        step_key = geo.num_slots * hl
        sources = _spread(np.arange(step_key, step_key + count, dtype=np.int64), -1, geo.engram_n)

        def look_back(rows: np.ndarray, s: np.ndarray, p: np.ndarray) -> None:
            """Shifts before the sequence's start: its history ring row, or -1 before position 0."""
            back = p[:, None] - np.arange(geo.engram_n)
            from_ring = np.where(back >= 0, (slots[s] * hl)[:, None] + back % hl, -1)
            np.copyto(rows, from_ring, where=back < start[s][:, None])

        # only a sequence's first N - 1 rows look back before its start
        looking_back = np.minimum(n, geo.engram_n - 1)
        if int(looking_back.sum()) == count:  # every row (short steps)
            look_back(sources, seg, pos)
        else:
            edge = _ranges(begin, begin + looking_back)
            if edge.size:
                rows = sources[edge]
                look_back(rows, seg[edge], pos[edge])
                sources[edge] = rows
        arrays["engram_sources"] = sources
        arrays["history_dest"], arrays["history_src"] = _suffix(
            np.maximum(start, end - hl), start, layout, end, slots, hl)
