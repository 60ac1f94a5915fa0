"""CUDA graphs of device-split verification steps (`DeepseekV41Runtime.forward_rows`).

Such a step's rows per sequence exist only on the device, but its total T is a host int, and the device
build (device_metadata.py) makes every shape a function of its `SplitShape`: the batch padded to a
bucket with padding sequences (slot 0, block 0: no real sequence's state is touched), T rounded up to a
multiple of `GRANULE` (the rows added go to padding sequences, their logits dropped), the most rows per
sequence (the verification length 1 + K) and the table width. A graph per shape holds the device half
of the build and the forward; each replay uploads the host half into the graph's persistent staging
buffer, copies the row counts and the device token ids into the buffers the graph reads, and replays.
Shapes are captured on first use (T still takes ~R * K / GRANULE values per bucket; the least recently
used graph is dropped beyond `MAX_GRAPHS`), on a batch of padding sequences only. The logits go to the
verification graphs' shared output buffer (graphs never replay concurrently and the logits are copied
out at once); a graph captured into a buffer that has since been replaced is captured again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from deepinfer.cache import BLOCK_TOKENS
from deepinfer.models.deepseek_v41.device_metadata import DeviceMetadataBuilder, SplitShape
from deepinfer.models.deepseek_v41.graphs import DecodeGraphs, GraphSet, StepFn, bucket_for, step_table_width
from deepinfer.models.deepseek_v41.metadata import Staging
from deepinfer.models.interface import ForwardBatch

MAX_GRAPHS = 256  # split graphs kept per cache (each holds its executable graph and pool blocks)
# totals are padded up to a multiple of this (the official engine keys decode graphs by total query
# tokens: 1, 2, 4, then multiples of 8): a few padding rows instead of a graph per total
GRANULE = 8


@dataclass
class _SplitGraph:
    staging: Staging  # the host half of the metadata the graph reads
    names: list[str]  # its arrays, in upload order
    rows: torch.Tensor  # [num_seqs] the row counts the graph reads
    ids: torch.Tensor  # [num_seqs * tokens] the flat upper-bound token ids the graph reads
    logits: torch.Tensor  # rows of the shared output buffer
    output: torch.Tensor  # that buffer (a replaced one means: capture again)
    replay: Callable[[], None]


class SplitGraphs(GraphSet[SplitShape, _SplitGraph]):
    """Graphs of one cache's device-split steps, beside its decode and verification graphs (`decode`:
    their recorder, buckets and output buffers). Rows per sequence: the verification length if planned,
    else 1 + the rollback depth (a step verifies at most that many drafts). `graphs` is kept in order of
    use, least recent first."""

    _what = "the split step {}"
    _then = "split steps run eagerly"

    def __init__(self, builder: DeviceMetadataBuilder, decode: DecodeGraphs, step: StepFn) -> None:
        super().__init__()
        self.builder, self.decode, self.step = builder, decode, step
        self.tokens = decode.verify_tokens or min(decode.max_backtrack + 1, builder.geo.max_fixed_tokens)

    def shape(self, batch: ForwardBatch, total: int) -> SplitShape | None:
        """The step's graph key, or None when it runs eagerly: its total rounded up to a multiple of
        `GRANULE`, the bucket with room for the padding sequences of any total in the granule (so they
        share the key), or the exact total where that room would pass the largest bucket."""
        segs = batch.segments
        if not segs or max(len(s.token_ids) for s in segs) > self.tokens:
            return None
        rows = -(-total // GRANULE) * GRANULE
        bucket = bucket_for(len(segs) + len(self._padding(GRANULE - 1)), self.decode.buckets)
        if bucket is None:
            rows, bucket = total, bucket_for(len(segs), self.decode.buckets)
        if bucket is None:
            return None
        return SplitShape(bucket, rows, self.tokens, step_table_width(segs, self.tokens))

    def _padding(self, pad: int) -> list[int]:
        """Row counts of the padding sequences that hold `pad` rows (each at most `tokens`)."""
        return [min(self.tokens, pad - i) for i in range(0, pad, self.tokens)]

    def forward(self, batch: ForwardBatch, rows: torch.Tensor, total: int) -> torch.Tensor | None:
        """Logits [total, V] through the step's graph (captured first if new); None: run it eagerly."""
        shape = None if self.failed else self.shape(batch, total)
        if shape is None:
            return None
        graph = self.graphs.pop(shape, None)
        if graph is None or graph.output is not self.decode.outputs.get(self.tokens):
            graph = self._capture_or_fail(shape)
            if graph is None:
                return None
        self.graphs[shape] = graph  # most recently used last
        host = self.builder.host_arrays(batch.segments, shape=shape)
        graph.staging.upload([host[n] for n in graph.names])  # persistent: the addresses the graph reads
        n = len(batch.segments)
        graph.rows[:n].copy_(rows)
        graph.rows[n:].zero_()
        for i, count in enumerate(self._padding(shape.rows - total)):
            graph.rows[n + i].fill_(count)
        if batch.input_ids is not None:
            graph.ids[: batch.input_ids.shape[0]].copy_(batch.input_ids)  # after the upload of the list ids
        graph.replay()
        return graph.logits[:total].clone()

    def _capture(self, shape: SplitShape) -> _SplitGraph:
        builder = self.builder
        staging = Staging(builder.staging.device, persistent=True)
        host = builder.host_arrays([], shape=shape)
        names = list(host)
        t = dict(zip(names, staging.upload([host[n] for n in names]), strict=True))
        # the capture's padding sequences share the rows out (each at most `tokens`)
        split = self._padding(shape.rows)
        split += [0] * (shape.num_seqs - len(split))
        rows = torch.tensor(split, dtype=torch.int64).to(t["slots"].device)
        capacity = {r: shape.table_width * (BLOCK_TOKENS // r) for r in builder.geo.ratios}
        out = self.decode._output(self.tokens, shape.rows)

        def step() -> torch.Tensor:
            meta = builder.device_build(t, rows, shape.rows, t["ids"], capacity)
            return out[: shape.rows].copy_(self.step(meta, None))

        logits, replay = self.decode.recorder(step)
        self.graphs = {k: g for k, g in self.graphs.items() if g.output is out}  # older buffers: recapture
        while len(self.graphs) >= MAX_GRAPHS:
            del self.graphs[next(iter(self.graphs))]
        return _SplitGraph(staging, names, rows, t["ids"], logits, out, replay)
