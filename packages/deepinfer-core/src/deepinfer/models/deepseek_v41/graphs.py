"""CUDA graphs for decode and verification steps and the DSpark draft forward (issue 10 item 6).

A step is graphable when no sequence brings more than StepGeometry.max_fixed_tokens tokens and every
one wants logits. Its graph key is a metadata.FixedShape: the batch padded up to the next bucket, n
tokens per sequence, the block-table width (a power of two, as eager steps use) and the logits rows.
n is 1 for decode steps, else the verification length (1 + draft tokens, `verify_tokens`) when every
segment fits it, else the longest segment. Shorter segments (uneven draft counts under confidence
scheduling or n-gram lookup, a decode beside verifications; not a prefill piece: that step runs
eagerly) are padded to n with padding tokens past their end: those rows' logits are dropped, and
their cache writes land at positions after the sequence's last token, exactly where rejected drafts
would have been written. The runtime rolls back by overwriting from the next step's start, and a
padded step reaches at most n - 1 <= max_backtrack positions past that start, the rollback depth
every ring (window, compressor partial groups, Engram history, DSpark context) keeps; padded
positions beyond the sequence's blocks go to padding block 0.

The first step of a key captures a graph (or `precapture` does at start-up): the warm-up and the
capture run on a batch of padding sequences only (slot 0, block 0), so no real sequence's state is
touched. Every later step of that key builds its metadata into the graph's own persistent staging
buffer (the addresses the graph reads), copies the engine's device-side token ids over the list
values, and replays. Prefill, steps with a segment wanting no logits and batches above the last bucket
run eagerly, and so does every step after a capture that failed (logged as a warning).

Memory: all graphs (decode, verification, draft) share one memory pool (owned by the recorder, so it
outlives any graph) and, per output kind, one output buffer (grown on demand, which drops the graphs
that wrote the old one: they are recaptured when next used); a replay's outputs are copied out at
once, so graphs never need each other's memory.

Why next to the model and not in the engine: what makes a step graphable is the model's metadata
(padded entry counts, fixed indexer capacity, fixed table width) and the model's reserved padding
slot 0 and block 0; the engine only sees ForwardBatch -> ForwardOutput, which this keeps unchanged.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

import numpy as np
import torch

from deepinfer.cache import BLOCK_TOKENS, KVCache
from deepinfer.models.deepseek_v41.dspark import DraftOutput, DSpark
from deepinfer.models.deepseek_v41.metadata import FixedShape, MetadataBuilder, Staging, StepMetadata
from deepinfer.models.interface import ForwardBatch, ForwardOutput, SequenceSegment
from deepinfer.ops.recorder import Recorder

logger = logging.getLogger(__name__)

K = TypeVar("K")  # a graph set's key
G = TypeVar("G")  # its graphs

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)
# a pool allocates whole segments (the caching allocator's 2 MiB small and 20 MiB large ones)
_POOL_ROUNDING = (2 + 20) << 20

# (metadata, device token ids or None: the metadata's) -> float32 logits of meta.logits_rows
StepFn = Callable[[StepMetadata, torch.Tensor | None], torch.Tensor]


class TritonCompilations:
    """Compiled specialisations per Triton kernel of the loaded modules (each JITFunction's in-memory
    cache, one entry per specialisation: constexpr values, int arguments == 1 or divisible by 16, pointer
    alignment, ...; compiled, or loaded from Triton's disk cache). Counting them around a step shows
    which kernels a new shape recompiles."""

    def __init__(self) -> None:
        self._modules = -1
        self._kernels: dict[str, Any] = {}

    def counts(self) -> Counter[str]:
        triton = sys.modules.get("triton")
        if triton is None:
            return Counter()
        if len(sys.modules) != self._modules:  # rescan only when modules were imported since
            self._modules = len(sys.modules)
            # module dicts only: a module's __getattr__ (lazy loaders) is never triggered
            spaces = [(name, space) for name, mod in list(sys.modules.items())
                      if (space := getattr(mod, "__dict__", None)) and space.get("triton") is triton]
            self._kernels = {f"{mod.rsplit('.', 1)[-1]}.{name}": fn for mod, space in spaces
                             for name, fn in list(space.items()) if hasattr(fn, "device_caches")}
        return Counter({name: n for name, fn in self._kernels.items()
                        if (n := sum(len(c[0]) for c in list(fn.device_caches.values())))})


@dataclass
class CaptureStats:
    """Where start-up capture time goes (CudaRecorder accumulates; GraphPlan.capture logs)."""

    graphs: int = 0
    warmup_s: float = 0.0  # eager warm-up steps, Triton compilations included
    capture_s: float = 0.0
    compiled: Counter[str] = field(default_factory=Counter)  # new specialisations per kernel

    def since(self, before: CaptureStats) -> CaptureStats:
        return CaptureStats(self.graphs - before.graphs, self.warmup_s - before.warmup_s,
                            self.capture_s - before.capture_s, self.compiled - before.compiled)

    def copy(self) -> CaptureStats:
        return replace(self, compiled=Counter(self.compiled))

    def describe(self) -> str:
        top = ", ".join(f"{k} {n}" for k, n in self.compiled.most_common(8))
        return (f"warm-up steps {self.warmup_s:.1f} s, captures {self.capture_s:.1f} s, "
                f"{self.compiled.total()} new Triton kernel specialisations" + (f" ({top})" if top else ""))


class CudaRecorder:
    """Captures into CUDA graphs that share one memory pool (graphs never replay concurrently).

    The recorder owns the pool (a MemPool holds one use of it): the caching allocator counts a pool's
    users, and once every graph captured into a bare graph_pool_handle() is gone (a grown output
    buffer or a new cache drops them) it refuses any further capture into that id with an internal
    assert, which left every later step eager."""

    def __init__(self, device: torch.device | None = None) -> None:
        with torch.cuda.device(device):
            self.mempool = torch.cuda.MemPool()
        self.pool = self.mempool.id
        self.compilations = TritonCompilations()
        self.stats = CaptureStats()

    def __call__(self, step: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, Callable[[], None]]:
        before, t0 = self.compilations.counts(), time.perf_counter()
        step()  # warm-up: Triton compiles and autotunes, lazy buffers are created, outside the capture
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        graph = torch.cuda.CUDAGraph()
        # thread_local: the engine's other threads may touch CUDA (host copies of samples) meanwhile
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            out = step()
        t2 = time.perf_counter()
        compiled = self.compilations.counts() - before
        self.stats.graphs += 1
        self.stats.warmup_s += t1 - t0
        self.stats.capture_s += t2 - t1
        self.stats.compiled += compiled
        logger.debug("CUDA graph: warm-up %.0f ms (Triton compilations: %s), capture %.0f ms",
                     (t1 - t0) * 1e3, dict(compiled) or "none", (t2 - t1) * 1e3)
        return out, graph.replay

    def pool_bytes(self) -> int:
        """Device memory the pool's segments hold (the graphs' intermediates, not the output buffers)."""
        pool = tuple(self.pool)
        return sum(s["total_size"] for s in torch.cuda.memory_snapshot()
                   if tuple(s.get("segment_pool_id", ())) == pool)


def bucket_for(num_seqs: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket holding `num_seqs` sequences, None above the last."""
    return next((b for b in buckets if b >= num_seqs), None)


def _check_buckets(buckets: Sequence[int]) -> tuple[int, ...]:
    if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] < 1:
        raise ValueError(f"graph buckets must be increasing positive batch sizes, got {buckets}")
    return tuple(buckets)


def graph_buckets(sizes: Sequence[int] | None) -> tuple[int, ...]:
    """The graphs' batch buckets: the chosen sizes (any order, repeats allowed), or BUCKETS for None."""
    return BUCKETS if sizes is None else _check_buckets(sorted(set(sizes)))


def planned_buckets(buckets: Sequence[int], max_num_seqs: int) -> list[int]:
    """The buckets captured ahead for batches of up to `max_num_seqs`: up to the one holding it."""
    top = bucket_for(max_num_seqs, buckets) or buckets[-1]
    return [b for b in buckets if b <= top]


def _table_width(blocks: int) -> int:
    return 1 << max(blocks - 1, 0).bit_length()


def step_table_width(segs: Sequence[SequenceSegment], n: int) -> int:
    """The table width of a padded step whose segments run up to n tokens each: the longest table, or
    the blocks the furthest new positions reach (ceil is monotone)."""
    furthest = max(s.start_pos for s in segs) + n
    return _table_width(max(max(len(s.block_table) for s in segs), -(-furthest // BLOCK_TOKENS)))


@dataclass
class _Graph:
    staging: Staging  # the metadata buffers the graph reads
    input_ids: torch.Tensor  # the graph's token-id buffer (the metadata's input_ids)
    logits: torch.Tensor  # the graph's output: rows of a shared output buffer
    replay: Callable[[], None]


def _grown(buffer: torch.Tensor | None, rows: int) -> int | None:
    """The rows of a new shared output buffer that holds `rows` (at least twice the old buffer's, so that
    few captures grow it: growing drops the graphs that wrote the old one); None while `buffer` holds them."""
    if buffer is None:
        return rows
    return None if buffer.shape[0] >= rows else max(rows, 2 * buffer.shape[0])


def _rows_per_seq(shape: FixedShape) -> int:
    return shape.tokens if shape.logits == "all" else 1


class GraphSet(Generic[K, G]):
    """What the decode, draft and split graph sets share: their graphs by key, and `failed`, set by the
    first capture that fails (an op that cannot be captured, e.g. one reading the device): the set then
    captures nothing more and its steps run eagerly. Subclasses define `_capture` and name, for that
    warning, the capture (`_what`, formatted with the key) and what runs eagerly (`_then`)."""

    _what = "{}"
    _then = "every step runs eagerly"

    def __init__(self) -> None:
        self.graphs: dict[K, G] = {}
        self.failed = False  # a capture failed: the set's steps run eagerly

    def _capture(self, key: K) -> G:
        raise NotImplementedError

    def _capture_or_fail(self, key: K) -> G | None:
        """The key's new graph, or None after a warning that its capture failed (and `failed` set)."""
        try:
            return self._capture(key)
        except RuntimeError as exc:
            what = self._what.format(key)
            logger.warning("CUDA graphs: capturing %s failed, %s from now on: %s", what, self._then, exc)
            self.failed = True
            return None

    def _precapture(self, keys: Sequence[K]) -> int:
        """Capture the keys not captured yet, in order, until one fails; the number captured."""
        count = 0
        for key in keys:
            if self.failed:
                break
            if key not in self.graphs and self._capture_or_fail(key) is not None:
                count += 1
        return count


class DecodeGraphs(GraphSet[FixedShape, _Graph]):
    """Graphs of one runtime's cache, captured per FixedShape (lazily, or ahead with `precapture`).

    `max_backtrack`: the cache's rollback depth, which bounds how far a segment may be padded.
    `verify_tokens`: the verification length (1 + the speculator's draft tokens) shorter segments are
    padded to; None: to the longest segment of the step.
    """

    def __init__(
        self,
        builder: MetadataBuilder,
        last_layer_is_consumer: bool,
        step: StepFn,
        vocab_size: int,
        recorder: Recorder,
        buckets: Sequence[int] = BUCKETS,
        max_backtrack: int = 0,
        verify_tokens: int | None = None,
    ) -> None:
        super().__init__()
        self.builder, self.last_is_consumer, self.step = builder, last_layer_is_consumer, step
        self.vocab_size, self.recorder, self.buckets = vocab_size, recorder, _check_buckets(buckets)
        self.max_backtrack, self.verify_tokens = max_backtrack, verify_tokens
        self.outputs: dict[int, torch.Tensor] = {}  # logits rows per sequence -> shared output buffer
        self.indices = Staging(builder.staging.device)  # padded steps: id destinations, logits rows

    def shape(self, batch: ForwardBatch) -> FixedShape | None:
        """The batch's graph key, or None when it runs eagerly."""
        segs = batch.segments
        num_seqs = bucket_for(len(segs), self.buckets) if segs else None
        if num_seqs is None:
            return None
        kinds = {s.logits for s in segs}
        if "none" in kinds:
            return None
        lens = [len(s.token_ids) for s in segs]
        longest = max(lens)
        verify = self.verify_tokens or 0
        n = verify if 1 < longest <= verify else longest
        if n > self.builder.geo.max_fixed_tokens:
            return None
        padded = min(lens) < n or (n > 1 and len(kinds) > 1)
        if padded and n > self.max_backtrack + 1:
            return None  # a rollback could not reach back over the padded positions
        if padded and any(k > 1 and s.logits != "all" for k, s in zip(lens, segs, strict=True)):
            return None  # a prefill piece among decodes: padding every decode to it costs more than it saves
        logits = "last" if n == 1 else "all" if padded else kinds.pop()
        return FixedShape(num_seqs, n, step_table_width(segs, n), logits)  # type: ignore[arg-type]

    def forward(self, batch: ForwardBatch) -> ForwardOutput | None:
        """Replay the batch's graph (capturing it first if new); None when the batch runs eagerly."""
        shape = None if self.failed else self.shape(batch)
        if shape is None:
            return None
        graph = self.graphs.get(shape) or self._capture_or_fail(shape)
        if graph is None:
            return None
        segs, n = batch.segments, shape.tokens
        padded = n > 1 and any(len(s.token_ids) < n or s.logits != shape.logits for s in segs)
        run = [self._pad(s, n) for s in segs] if padded else segs
        meta = self.builder.build(ForwardBatch(run), self.last_is_consumer, shape, graph.staging)
        if meta.input_ids.data_ptr() != graph.input_ids.data_ptr():
            raise RuntimeError(f"the metadata of {shape} moved out of the buffers its graph reads")
        if not padded:
            if batch.input_ids is not None:
                self._check_ids(batch, len(segs) * n)
                graph.input_ids[: len(segs) * n].copy_(batch.input_ids)  # after the metadata upload
            graph.replay()
            offsets = meta.row_offsets[: len(segs) + 1]
            return ForwardOutput(logits=graph.logits[: offsets[-1]].clone(), row_offsets=offsets)

        # padded: real tokens sit at i * n + [0, len) of sequence i; keep only the rows it asked for
        lens = np.array([len(s.token_ids) for s in segs], dtype=np.int64)
        firsts = np.arange(len(segs), dtype=np.int64) * n
        dest = np.concatenate([np.arange(f, f + k) for f, k in zip(firsts, lens, strict=True)])
        picks = np.concatenate([np.arange(f, f + k) if s.logits == "all" else [f + k - 1]
                                for f, k, s in zip(firsts, lens, segs, strict=True)]).astype(np.int64)
        dest_t, picks_t = self.indices.upload([dest, picks])
        if batch.input_ids is not None:
            self._check_ids(batch, int(lens.sum()))
            graph.input_ids.index_copy_(0, dest_t, batch.input_ids)
        graph.replay()
        rows = [k if s.logits == "all" else 1 for k, s in zip(lens.tolist(), segs, strict=True)]
        offsets = np.concatenate(([0], np.cumsum(rows))).tolist()
        return ForwardOutput(logits=graph.logits.index_select(0, picks_t), row_offsets=offsets)

    @staticmethod
    def _pad(seg: SequenceSegment, n: int) -> SequenceSegment:
        """`seg` with padding tokens up to n, every row's logits, and padding block 0 wherever the
        padded positions pass its blocks (the engine reserves blocks for its real tokens only)."""
        blocks = -(-(seg.start_pos + n) // BLOCK_TOKENS)
        table = seg.block_table + [0] * (blocks - len(seg.block_table))
        return replace(seg, block_table=table, token_ids=seg.token_ids + [0] * (n - len(seg.token_ids)),
                       logits="all")

    @staticmethod
    def _check_ids(batch: ForwardBatch, rows: int) -> None:
        if batch.input_ids.shape != (rows,):  # type: ignore[union-attr]
            raise ValueError(f"input_ids has shape {tuple(batch.input_ids.shape)}, "  # type: ignore[union-attr]
                             f"the segments hold {rows} tokens")

    def planned(self, max_num_seqs: int) -> list[int]:
        return planned_buckets(self.buckets, max_num_seqs)

    def precapture(self, max_num_seqs: int, max_model_len: int) -> int:
        """Capture decode (and, with `verify_tokens`, verification) graphs of every bucket up to the
        one holding `max_num_seqs`, at every table width up to max_model_len's; the number captured."""
        tokens = [n for n in (1, self.verify_tokens) if n and n <= self.builder.geo.max_fixed_tokens]
        widths = _table_width(-(-(max_model_len + max(tokens)) // BLOCK_TOKENS))
        shapes = [FixedShape(b, n, 1 << i, "last" if n == 1 else "all") for n in tokens
                  for b in self.planned(max_num_seqs) for i in range(widths.bit_length())]
        # largest first: the output buffers are sized once, and the pool's first segments are the
        # largest, which the smaller graphs' blocks then split (rather than new segments per size)
        shapes.sort(key=lambda k: (k.num_seqs * k.tokens, k.table_width), reverse=True)
        return self._precapture(shapes)

    def _capture(self, shape: FixedShape) -> _Graph:
        staging = Staging(self.builder.staging.device, persistent=True)
        meta = self.builder.build(ForwardBatch([]), self.last_is_consumer, shape, staging)
        out = self._output(_rows_per_seq(shape), len(meta.logits_rows))
        t0 = time.perf_counter()
        logits, replay = self.recorder(lambda: out[: len(meta.logits_rows)].copy_(self.step(meta, None)))
        logger.debug("captured a CUDA graph for %d x %d tokens (table width %d, logits %s) in %.0f ms",
                     shape.num_seqs, shape.tokens, shape.table_width, shape.logits,
                     (time.perf_counter() - t0) * 1e3)
        graph = _Graph(staging, meta.input_ids, logits, replay)
        self.graphs[shape] = graph
        return graph

    def _output(self, rows_per_seq: int, rows: int) -> torch.Tensor:
        """The output buffer of graphs with `rows_per_seq` logits rows per sequence, at least `rows` long."""
        out = self.outputs.get(rows_per_seq)
        if (size := _grown(out, rows)) is not None:
            out = torch.empty(size, self.vocab_size, dtype=torch.float32, device=self.builder.staging.device)
            self.outputs[rows_per_seq] = out
            self.graphs = {k: g for k, g in self.graphs.items() if _rows_per_seq(k) != rows_per_seq}
        return out


@dataclass
class _DraftGraph:
    staging: Staging  # ids, positions, window keys the graph reads
    rows: int  # bucket * block size
    replay: Callable[[], None]


class DraftGraphs(GraphSet[int, _DraftGraph]):
    """Graphs of the DSpark draft forward over one cache, one per batch bucket.

    A draft step's inputs (ids, positions, window key rows) depend only on the sequences' slots,
    anchors and golden tokens, so padding sequences (slot 0, anchor 0: no context keys) fill a bucket;
    the three outputs are copied into shared buffers and cloned out after each replay.
    """

    _what = "the draft forward of {} sequences"
    _then = "drafts run eagerly"

    def __init__(
        self, dspark: DSpark, cache: KVCache, recorder: Recorder, buckets: Sequence[int] = BUCKETS
    ) -> None:
        super().__init__()
        self.dspark, self.cache, self.recorder = dspark, cache, recorder
        self.buckets = _check_buckets(buckets)
        self.outputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # hidden, normed, logits

    def draft(
        self, cache: KVCache, slots: Sequence[int], anchors: Sequence[int], golden: Sequence[int]
    ) -> DraftOutput | None:
        """The draft outputs through the bucket's graph; None when the step runs eagerly."""
        bucket = bucket_for(len(slots), self.buckets) if slots else None
        if self.failed or cache is not self.cache or bucket is None:
            return None
        graph = self.graphs.get(bucket) or self._capture_or_fail(bucket)
        if graph is None:
            return None
        arrays = self.dspark.draft_arrays(cache, slots, anchors, golden, bucket)
        graph.staging.upload(arrays)  # persistent: the same addresses the capture read
        graph.replay()
        n, rows = len(slots), len(slots) * self.dspark.block_size
        hidden, normed, logits = (buf[:rows].view(n, self.dspark.block_size, -1).clone()
                                  for buf in self.outputs)  # type: ignore[union-attr]
        return DraftOutput(hidden, normed, logits)

    def precapture(self, max_num_seqs: int) -> int:
        """Capture every bucket up to the one holding `max_num_seqs`; the number captured."""
        # largest first: the output buffers are sized once
        return self._precapture(planned_buckets(self.buckets, max_num_seqs)[::-1])

    def _capture(self, bucket: int) -> _DraftGraph:
        ds = self.dspark
        staging = Staging(ds.staging.device, persistent=True)
        ids, positions, window = staging.upload(ds.draft_arrays(self.cache, [], [], [], bucket))
        rows = bucket * ds.block_size
        hidden, normed, logits = self._outputs(rows)

        def step() -> torch.Tensor:
            out = ds.draft_forward(self.cache, ids, positions, window)
            hidden[:rows].copy_(out.hidden.view(rows, -1))
            normed[:rows].copy_(out.normed.view(rows, -1))
            return logits[:rows].copy_(out.base_logits.view(rows, -1))

        _, replay = self.recorder(step)
        graph = _DraftGraph(staging, rows, replay)
        self.graphs[bucket] = graph
        return graph

    def _outputs(self, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The shared output buffers, at least `rows` long (growing them drops the older graphs)."""
        if (size := _grown(self.outputs[0] if self.outputs else None, rows)) is not None:
            ds, device = self.dspark, self.dspark.staging.device
            h = ds.cfg.hidden_size
            self.outputs = (torch.empty(size, h, dtype=ds.dtype, device=device),
                            torch.empty(size, h, dtype=ds.dtype, device=device),
                            torch.empty(size, ds.cfg.vocab_size, dtype=torch.float32, device=device))
            self.graphs = {}
        return self.outputs


@dataclass(frozen=True)
class GraphPlan:
    """What to capture at start-up, before the first request (runtime.plan_graphs)."""

    max_num_seqs: int
    verify_tokens: int | None  # 1 + the speculator's draft tokens; None: no speculation planned
    max_model_len: int
    reserve: int = 0  # the bytes probe_graph_memory kept for the graphs
    buckets: tuple[int, ...] = BUCKETS  # the graphs' batch sizes (RuntimeOptions.cuda_graph_sizes)

    def tokens(self, geo_max: int) -> list[int]:
        """Tokens per sequence of the planned step kinds that have fixed shapes (decode first)."""
        return [n for n in (1, self.verify_tokens) if n and n <= geo_max]

    def capture(self, decode: DecodeGraphs, draft: DraftGraphs | None, recorder: Recorder) -> None:
        """Capture every planned graph of one cache; one INFO line with the count, time and memory."""
        cuda = isinstance(recorder, CudaRecorder)
        before = recorder.stats.copy() if cuda else None
        t0 = time.perf_counter()
        count = decode.precapture(self.max_num_seqs, self.max_model_len)
        if draft is not None and self.verify_tokens:  # drafts come with speculation only
            count += draft.precapture(self.max_num_seqs)
        buffers = [*decode.outputs.values(), *((draft.outputs or ()) if draft else ())]
        outputs = sum(t.nbytes for t in buffers)
        pool = recorder.pool_bytes() if cuda else 0
        spent = "; " + recorder.stats.since(before).describe() if cuda else ""  # type: ignore[arg-type]
        logger.info("CUDA graphs: captured %d graphs of batch sizes %s in %.1f s%s (pool %.0f MiB, "
                    "output buffers %.0f MiB)", count, ",".join(map(str, decode.planned(self.max_num_seqs))),
                    time.perf_counter() - t0, spent, pool / 2**20, outputs / 2**20)
        if self.reserve and pool + outputs > self.reserve:
            logger.warning("CUDA graphs hold %.0f MiB, %.0f MiB more than was kept out of the cache budget",
                           (pool + outputs) / 2**20, (pool + outputs - self.reserve) / 2**20)


def probe_graph_memory(
    plan: GraphPlan, builder: MetadataBuilder, last_layer_is_consumer: bool, step: StepFn, vocab_size: int,
    dspark: DSpark | None, cache: KVCache,
) -> int:
    """Device bytes the planned graphs will hold: the peak of eager padding-only steps of the largest
    planned shapes (a graph's pool holds what its step allocates; graphs in one pool reuse each
    other's freed memory) plus the shared output buffers and the pool's segment rounding. 0 off CUDA."""
    device = builder.staging.device
    if device.type != "cuda":
        return 0
    top = planned_buckets(plan.buckets, plan.max_num_seqs)[-1]
    compilations, t0 = TritonCompilations(), time.perf_counter()
    before = compilations.counts()
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    outputs = 0
    for n in plan.tokens(builder.geo.max_fixed_tokens):
        width = _table_width(-(-(plan.max_model_len + n) // BLOCK_TOKENS))
        shape = FixedShape(top, n, width, "last" if n == 1 else "all")
        meta = builder.build(ForwardBatch([]), last_layer_is_consumer, shape)
        step(meta, None)
        outputs += len(meta.logits_rows) * vocab_size * 4
    if dspark is not None and plan.verify_tokens:
        ids, positions, window = dspark.staging.upload(dspark.draft_arrays(cache, [], [], [], top))
        out = dspark.draft_forward(cache, ids, positions, window)
        outputs += out.hidden.nbytes + out.normed.nbytes + out.base_logits.nbytes
    torch.cuda.synchronize(device)
    logger.info("CUDA graphs: memory probe (eager steps of %d sequences) in %.1f s, %d new Triton kernel "
                "specialisations",
                top, time.perf_counter() - t0, (compilations.counts() - before).total())
    return torch.cuda.max_memory_allocated(device) - base + outputs + _POOL_ROUNDING
