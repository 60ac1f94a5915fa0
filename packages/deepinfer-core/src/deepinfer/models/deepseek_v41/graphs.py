"""CUDA graphs for decode and verification steps (issue 10 item 6).

A step is graphable when every sequence brings the same number of tokens n (decode: 1; verification:
1 + draft tokens, up to StepGeometry.max_fixed_tokens) and wants the same logits rows. Its graph key
is a metadata.FixedShape: the batch padded up to the next bucket, n, the block-table width (a power
of two, as eager steps use) and the logits rows. The first step of a key captures a graph: the warm-up
and the capture run on a batch of padding sequences only, so no real sequence's state is touched.
Every later step of that key builds its metadata into the graph's own persistent staging buffer (the
addresses the graph reads), copies the engine's device-side token ids over the list values, and
replays. Prefill, mixed steps and batches above the last bucket run eagerly, and so does every step
after a capture that failed (an op that cannot be captured: logged as a warning).

Memory: the graphs share one memory pool and, per number of logits rows per sequence, one output
buffer (grown on demand, which drops the graphs that wrote the old one: they are recaptured when next
used); a replay's logits are copied out at once, so graphs never need each other's memory.

Why next to the model and not in the engine: what makes a step graphable is the model's metadata
(padded entry counts, fixed indexer capacity, fixed table width) and the model's reserved padding
slot 0 and block 0; the engine only sees ForwardBatch -> ForwardOutput, which this keeps unchanged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from deepinfer.models.deepseek_v41.metadata import FixedShape, MetadataBuilder, Staging, StepMetadata
from deepinfer.models.interface import ForwardBatch, ForwardOutput

logger = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)

# (metadata, device token ids or None: the metadata's) -> float32 logits of meta.logits_rows
StepFn = Callable[[StepMetadata, torch.Tensor | None], torch.Tensor]


class Recorder(Protocol):
    def __call__(self, step: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, Callable[[], None]]:
        """Record `step`; return its output (a static tensor every replay rewrites) and the replay."""
        ...


class CudaRecorder:
    """Captures into CUDA graphs that share one memory pool (graphs never replay concurrently)."""

    def __init__(self) -> None:
        self.pool = torch.cuda.graph_pool_handle()

    def __call__(self, step: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, Callable[[], None]]:
        step()  # warm-up: Triton compiles and autotunes, lazy buffers are created, outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        # thread_local: the engine's other threads may touch CUDA (host copies of samples) meanwhile
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            out = step()
        return out, graph.replay


@dataclass
class _Graph:
    staging: Staging  # the metadata buffers the graph reads
    input_ids: torch.Tensor  # the graph's token-id buffer (the metadata's input_ids)
    logits: torch.Tensor  # the graph's output: rows of a shared output buffer
    replay: Callable[[], None]


def _rows_per_seq(shape: FixedShape) -> int:
    return shape.tokens if shape.logits == "all" else 1


class DecodeGraphs:
    """Graphs of one runtime's cache, captured lazily per FixedShape."""

    def __init__(
        self,
        builder: MetadataBuilder,
        last_layer_is_consumer: bool,
        step: StepFn,
        vocab_size: int,
        recorder: Recorder,
        buckets: Sequence[int] = BUCKETS,
    ) -> None:
        if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] < 1:
            raise ValueError(f"graph buckets must be increasing positive batch sizes, got {buckets}")
        self.builder, self.last_is_consumer, self.step = builder, last_layer_is_consumer, step
        self.vocab_size, self.recorder, self.buckets = vocab_size, recorder, tuple(buckets)
        self.graphs: dict[FixedShape, _Graph] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # logits rows per sequence -> shared output buffer
        self.failed = False  # a capture failed: every step runs eagerly

    def shape(self, batch: ForwardBatch) -> FixedShape | None:
        """The batch's graph key, or None when it runs eagerly."""
        segs = batch.segments
        if not segs or len(segs) > self.buckets[-1]:
            return None
        n = len(segs[0].token_ids)
        logits = "last" if n == 1 else segs[0].logits
        if not 0 < n <= self.builder.geo.max_fixed_tokens or logits == "none":
            return None
        for s in segs:
            if len(s.token_ids) != n or s.logits == "none" or (n > 1 and s.logits != logits):
                return None
        num_seqs = next(b for b in self.buckets if b >= len(segs))
        width = 1 << max(max(len(s.block_table) for s in segs) - 1, 0).bit_length()
        return FixedShape(num_seqs, n, width, logits)  # type: ignore[arg-type]

    def forward(self, batch: ForwardBatch) -> ForwardOutput | None:
        """Replay the batch's graph (capturing it first if new); None when the batch runs eagerly."""
        shape = None if self.failed else self.shape(batch)
        if shape is None:
            return None
        graph = self.graphs.get(shape)
        if graph is None:
            try:
                graph = self._capture(shape)
            except RuntimeError as exc:  # an op that cannot be captured (e.g. one reading the device)
                logger.warning("CUDA graphs: capturing %s failed, every step runs eagerly from now on: %s",
                               shape, exc)
                self.failed = True
                return None
        meta = self.builder.build(batch, self.last_is_consumer, shape, graph.staging)
        if meta.input_ids.data_ptr() != graph.input_ids.data_ptr():
            raise RuntimeError(f"the metadata of {shape} moved out of the buffers its graph reads")
        rows = len(batch.segments) * shape.tokens
        if batch.input_ids is not None:
            if batch.input_ids.shape != (rows,):
                raise ValueError(f"input_ids has shape {tuple(batch.input_ids.shape)}, "
                                 f"the segments hold {rows} tokens")
            graph.input_ids[:rows].copy_(batch.input_ids)  # after the metadata upload, in stream order
        graph.replay()
        offsets = meta.row_offsets[: len(batch.segments) + 1]
        return ForwardOutput(logits=graph.logits[: offsets[-1]].clone(), row_offsets=offsets)

    def _capture(self, shape: FixedShape) -> _Graph:
        staging = Staging(self.builder.staging.device, persistent=True)
        meta = self.builder.build(ForwardBatch([]), self.last_is_consumer, shape, staging)
        out = self._output(_rows_per_seq(shape), len(meta.logits_rows))
        t0 = time.perf_counter()
        logits, replay = self.recorder(lambda: out[: len(meta.logits_rows)].copy_(self.step(meta, None)))
        logger.info("captured a CUDA graph for %d x %d tokens (table width %d, logits %s) in %.0f ms",
                    shape.num_seqs, shape.tokens, shape.table_width, shape.logits,
                    (time.perf_counter() - t0) * 1e3)
        graph = _Graph(staging, meta.input_ids, logits, replay)
        self.graphs[shape] = graph
        return graph

    def _output(self, rows_per_seq: int, rows: int) -> torch.Tensor:
        """The output buffer of graphs with `rows_per_seq` logits rows per sequence, at least `rows` long."""
        out = self.outputs.get(rows_per_seq)
        if out is None or out.shape[0] < rows:
            rows = max(rows, 2 * out.shape[0]) if out is not None else rows
            out = torch.empty(rows, self.vocab_size, dtype=torch.float32, device=self.builder.staging.device)
            self.outputs[rows_per_seq] = out
            self.graphs = {k: g for k, g in self.graphs.items() if _rows_per_seq(k) != rows_per_seq}
        return out
