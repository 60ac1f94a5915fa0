"""Per-forward state shared by the attention layers of one step (see NOTES.md for the protocol).

Built once from the engine's ForwardBatch: where each segment's tokens sit (slot, block table,
positions), which rows each layer computes (bounded replay), and the cross-layer attention state
that Full / Reindex layers publish and Reuse layers read (model spec §4.2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from deepinfer.cache import KVCache
from deepinfer.config import LayerSpec, TextConfig
from deepinfer.models.interface import ForwardBatch

ReplayMode = Literal["off", "mask", "compact"]


@dataclass(frozen=True)
class BoundedReplay:
    """SWA bounded replay (deepinfer-official §8): consumer layers need only the kept suffix."""

    mode: ReplayMode = "off"
    keep: int = 140


@dataclass(frozen=True)
class Segment:
    slot: int
    block_table: torch.Tensor  # long [blocks]
    start: int  # position of the first new token
    end: int  # one past the last new token
    consumer_from: int  # consumer layers see no window keys before this position (0 without replay)


@dataclass(frozen=True)
class Rows:
    """The token rows a layer computes: positions [n] and each segment's [begin, end) row range."""

    positions: torch.Tensor
    bounds: tuple[tuple[int, int], ...]

    @property
    def count(self) -> int:
        return self.positions.shape[0]


@dataclass(frozen=True)
class CompressedStream:
    """Decoded compressed KV and index keys of the latest KV source, entries [0, end // ratio) per segment."""

    source: int
    kv: list[torch.Tensor]  # [entries, head_dim]
    index_keys: list[torch.Tensor]  # [entries, index_head_dim]


@dataclass(frozen=True)
class Selection:
    """Per-row selected entries of the latest index source (-1 = empty), or its candidate mask."""

    source: int
    per_segment: list[torch.Tensor]  # topk: long [rows, <= index_topk]; candidates: bool [rows, entries]


def _rows(segments: list[Segment], firsts: list[int], device: torch.device) -> Rows:
    bounds, begin, pos = [], 0, []
    for seg, first in zip(segments, firsts, strict=True):
        bounds.append((begin, begin + seg.end - first))
        begin += seg.end - first
        pos.append(torch.arange(first, seg.end, device=device))
    return Rows(torch.cat(pos), tuple(bounds))


class StepState:
    def __init__(self, cfg: TextConfig, cache: KVCache, segments: list[Segment], replay: BoundedReplay):
        self.cfg, self.cache, self.segments, self.replay = cfg, cache, segments, replay
        device = cache.blocks.device
        self.all_rows = _rows(segments, [s.start for s in segments], device)
        if replay.mode == "compact":
            self.consumer_rows = _rows(segments, [max(s.start, s.consumer_from) for s in segments], device)
        else:
            self.consumer_rows = self.all_rows
        self.shared_input: torch.Tensor | None = (
            None  # YOCO: normed input of the first consumer layer, all rows
        )
        self.compressed: CompressedStream | None = None
        self.topk: Selection | None = None
        self.candidates: Selection | None = None

    @classmethod
    def build(
        cls, batch: ForwardBatch, cfg: TextConfig, cache: KVCache, replay: BoundedReplay | None = None
    ) -> StepState:
        replay = replay or BoundedReplay()
        if replay.mode not in ("off", "mask", "compact"):
            raise ValueError(f"bounded replay mode must be off, mask or compact, got {replay.mode!r}")
        if replay.mode != "off":
            need = cfg.sliding_window + cache.max_backtrack
            if replay.keep < need:
                raise ValueError(
                    f"bounded replay keep={replay.keep} is smaller than sliding_window + max_backtrack = "
                    f"{need}; decode after a rollback would read consumer window keys never written"
                )
            if not 0 < cfg.n_prefill_layer < cfg.num_hidden_layers:
                raise ValueError(
                    "bounded replay needs a model with YOCO consumer layers (0 < n_prefill_layer < L)"
                )
        device = cache.blocks.device
        segments = []
        for s in batch.segments:
            if not s.token_ids:
                raise ValueError(f"segment of slot {s.slot} has no tokens")
            end = s.start_pos + len(s.token_ids)
            segments.append(
                Segment(
                    slot=s.slot,
                    block_table=torch.tensor(s.block_table, dtype=torch.long, device=device),
                    start=s.start_pos,
                    end=end,
                    consumer_from=max(0, end - replay.keep) if replay.mode != "off" else 0,
                )
            )
        return cls(cfg, cache, segments, replay)

    def rows(self, spec: LayerSpec) -> Rows:
        return self.consumer_rows if spec.is_yoco_consumer else self.all_rows

    def enter_consumer_half(self, shared_input: torch.Tensor) -> torch.Tensor | None:
        """Record the first consumer layer's normed input (all rows); under compact return the kept rows."""
        if shared_input.shape[0] != self.all_rows.count:
            raise ValueError(
                f"shared input has {shared_input.shape[0]} rows, expected all {self.all_rows.count}"
            )
        self.shared_input = shared_input
        if self.consumer_rows is self.all_rows:
            return None
        # kept rows are each segment's suffix, so they end where the segment's full rows end
        return torch.cat(
            [
                torch.arange(e - (kept_e - kept_b), e, device=shared_input.device)
                for (_, e), (kept_b, kept_e) in zip(
                    self.all_rows.bounds, self.consumer_rows.bounds, strict=True
                )
            ]
        )

    def stream(self, spec: LayerSpec) -> CompressedStream:
        if self.compressed is None or self.compressed.source != spec.kv_source:
            raise RuntimeError(
                f"layer {spec.index} needs the compressed stream of layer {spec.kv_source}, "
                "which has not run in this step"
            )
        return self.compressed

    def selection(self, spec: LayerSpec) -> Selection:
        if self.topk is None or self.topk.source != spec.topk_source:
            raise RuntimeError(
                f"layer {spec.index} needs the top-k of layer {spec.topk_source}, "
                "which has not run in this step"
            )
        return self.topk
