"""Per-forward state shared by the attention layers of one step.

Holds the step's StepMetadata (flat tensors, metadata.py), the cache, and the cross-layer attention
state that Full / Reindex layers publish and Reuse layers read (model spec §4.2): the top-k selection
and candidate mask of the latest index source, and which KV source has written this step's entries.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch

from deepinfer.cache import KVCache
from deepinfer.config import LayerSpec, TextConfig
from deepinfer.models.deepseek_v41.metadata import (
    BoundedReplay,
    MetadataBuilder,
    ReplayMode,
    RowSet,
    StepGeometry,
    StepMetadata,
)
from deepinfer.models.deepseek_v41.rope import Rope
from deepinfer.models.interface import ForwardBatch

__all__ = ["BoundedReplay", "ReplayMode", "Selection", "StepState", "check_replay", "step_geometry"]


@dataclass(frozen=True)
class Selection:
    """Per-row result of the latest index source: top-k entry ids [rows, index_topk] (-1 = empty),
    or its candidate mask [rows, capacity]."""

    source: int
    value: torch.Tensor


def check_replay(cfg: TextConfig, replay: BoundedReplay, max_backtrack: int) -> None:
    if replay.mode not in ("off", "mask", "compact"):
        raise ValueError(f"bounded replay mode must be off, mask or compact, got {replay.mode!r}")
    if replay.mode == "off":
        return
    need = cfg.sliding_window + max_backtrack
    if replay.keep < need:
        raise ValueError(
            f"bounded replay keep={replay.keep} is smaller than sliding_window + max_backtrack = "
            f"{need}; decode after a rollback would read consumer window keys never written"
        )
    if not 0 < cfg.n_prefill_layer < cfg.num_hidden_layers:
        raise ValueError("bounded replay needs a model with YOCO consumer layers (0 < n_prefill_layer < L)")


def step_geometry(
    cfg: TextConfig, cache: KVCache, replay: BoundedReplay, engram_n: int = 0, history_len: int = 0
) -> StepGeometry:
    """The index geometry of `cache` (ring lengths, slot count, compress ratios)."""
    state_lens, ratios = {}, set()
    for spec in cfg.layers:
        if spec.owns_compressor:
            ratios.add(spec.compress_ratio)
            if spec.compress_ratio > 1:
                state_lens[spec.compress_ratio] = cache.compressor_state(spec.index).length
    return StepGeometry(
        window=cfg.sliding_window,
        ring_len=cfg.sliding_window + cache.max_backtrack,
        num_slots=cache.slots.shape[0],
        state_lens=state_lens,
        ratios=tuple(sorted(ratios)),
        replay=replay,
        engram_n=engram_n,
        history_len=history_len,
    )


class StepState:
    def __init__(self, cfg: TextConfig, cache: KVCache, meta: StepMetadata):
        self.cfg, self.cache, self.meta = cfg, cache, meta
        self.shared_input: torch.Tensor | None = None  # YOCO: normed input of the first consumer layer
        self.compressed_by: int | None = None  # KV source whose compressor ran last in this step
        self.topk: Selection | None = None
        self.candidates: Selection | None = None
        # RoPE angles by (frequency table, positions): layers with one θ and YaRN flag share them
        self._angles: dict[tuple[Hashable, int], tuple[torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def build(
        cls, batch: ForwardBatch, cfg: TextConfig, cache: KVCache, replay: BoundedReplay | None = None
    ) -> StepState:
        """One-off state with a fresh metadata builder (runtimes keep a persistent builder)."""
        replay = replay or BoundedReplay()
        check_replay(cfg, replay, cache.max_backtrack)
        builder = MetadataBuilder(step_geometry(cfg, cache, replay), cache.blocks.device)
        last_is_consumer = cfg.layers[cfg.num_hidden_layers - 1].is_yoco_consumer
        return cls(cfg, cache, builder.build(batch, last_is_consumer))

    def angles(self, rope: Rope, positions: torch.Tensor) -> torch.Tensor:
        """rope.angles(positions), computed once per step for all layers with rope's frequency table."""
        key = (rope.key, id(positions))
        hit = self._angles.get(key)
        if hit is None:  # the entry holds `positions`: its id stays unique while the step lives
            hit = self._angles[key] = (positions, rope.angles(positions))
        return hit[1]

    def rows(self, spec: LayerSpec) -> RowSet:
        return self.meta.consumer_rows if spec.is_yoco_consumer else self.meta.all_rows

    def enter_consumer_half(self, shared_input: torch.Tensor) -> torch.Tensor | None:
        """Record the first consumer layer's normed input (all rows); under compact return the kept rows."""
        if shared_input.shape[0] != self.meta.num_rows:
            raise ValueError(f"shared input has {shared_input.shape[0]} rows, expected {self.meta.num_rows}")
        self.shared_input = shared_input
        return self.meta.kept

    def check_stream(self, spec: LayerSpec) -> None:
        if self.compressed_by != spec.kv_source:
            raise RuntimeError(
                f"layer {spec.index} reads the compressed entries of layer {spec.kv_source}, "
                "which has not run in this step"
            )

    def selection(self, spec: LayerSpec) -> torch.Tensor:
        if self.topk is None or self.topk.source != spec.topk_source:
            raise RuntimeError(
                f"layer {spec.index} needs the top-k of layer {spec.topk_source}, "
                "which has not run in this step"
            )
        return self.topk.value
