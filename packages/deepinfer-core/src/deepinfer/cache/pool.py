"""The allocated cache: a paged block pool and per-sequence state slots, both raw bytes.

Block 0 and slot 0 are padding and never hold a sequence. Layers read and write through typed
views: `PagedEntries` (compressed KV / index keys, addressed by entry index through a block table)
and `Ring` (per-slot rings addressed by absolute position modulo the ring length).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer.cache.codecs import Codec
from deepinfer.cache.layout import CachePrecision, CacheSpec, Region, RegionKind, cache_spec
from deepinfer.config import TextConfig
from deepinfer.ops import Ops, get_ops


def _view(storage: torch.Tensor, region: Region) -> torch.Tensor:
    span = region.entries * region.codec.nbytes
    rows = storage[:, region.offset : region.offset + span]
    return rows.unflatten(1, (region.entries, region.codec.nbytes))


@dataclass
class PagedEntries:
    """Entries of one stream: entry j of a sequence lives in block block_table[j // E] at j % E."""

    data: torch.Tensor  # [num_blocks, E, nbytes] view into the pool
    codec: Codec
    ops: Ops

    def _where(self, block_table: torch.Tensor, entries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        per_block = self.data.shape[1]
        return block_table[entries // per_block], entries % per_block

    def write(self, block_table: torch.Tensor, entries: torch.Tensor, encoded: torch.Tensor) -> None:
        self.data[self._where(block_table, entries)] = encoded

    def load(self, block_table: torch.Tensor, count: int) -> torch.Tensor:
        """Decoded entries [0, count) of a sequence -> [count, dim]."""
        entries = torch.arange(count, device=self.data.device)
        return self.codec.decode(self.data[self._where(block_table, entries)], self.ops)


@dataclass
class Ring:
    """Per-slot ring: position p of the slot's sequence lives at entry p mod len."""

    data: torch.Tensor  # [num_slots, len, nbytes] view into the slot storage
    codec: Codec
    ops: Ops

    @property
    def length(self) -> int:
        return self.data.shape[1]

    def write(self, slot: int, positions: torch.Tensor, encoded: torch.Tensor) -> None:
        self.data[slot, positions % self.length] = encoded

    def load(self, slot: int, positions: torch.Tensor) -> torch.Tensor:
        return self.codec.decode(self.data[slot, positions % self.length], self.ops)


class KVCache:
    """Pools for one model: `num_blocks` paged blocks, `num_slots` state slots (index 0 of each: padding)."""

    def __init__(
        self,
        cfg: TextConfig,
        num_blocks: int,
        num_slots: int,
        precision: CachePrecision,
        dtype: torch.dtype,
        max_backtrack: int,
        device: torch.device | str = "cpu",
        ops: Ops | None = None,
    ):
        if num_blocks < 2 or num_slots < 2:
            raise ValueError("need at least one usable block and slot besides padding block 0 / slot 0")
        self.spec: CacheSpec = cache_spec(cfg, precision, dtype, max_backtrack)
        self.precision, self.dtype, self.max_backtrack = precision, dtype, max_backtrack
        self.ops = ops or get_ops(device=device)
        self.blocks = torch.zeros(num_blocks, self.spec.bytes_per_block, dtype=torch.uint8, device=device)
        self.slots = torch.zeros(num_slots, self.spec.bytes_per_slot, dtype=torch.uint8, device=device)

    def _block_region(self, kind: RegionKind, layer: int) -> PagedEntries:
        region = self.spec.block_regions[(kind, layer)]
        return PagedEntries(_view(self.blocks, region), region.codec, self.ops)

    def _slot_region(self, kind: RegionKind, layer: int) -> Ring:
        region = self.spec.slot_regions[(kind, layer)]
        return Ring(_view(self.slots, region), region.codec, self.ops)

    def compressed_kv(self, layer: int) -> PagedEntries:
        return self._block_region("kv", layer)

    def index_keys(self, layer: int) -> PagedEntries:
        return self._block_region("index", layer)

    def window(self, layer: int) -> Ring:
        return self._slot_region("window", layer)

    def compressor_state(self, layer: int) -> Ring:
        return self._slot_region("compressor", layer)

    def reset_slot(self, slot: int) -> None:
        self.slots[slot].zero_()

    # Forking a sequence (n > 1 completions of one prompt): the pools are raw bytes of every layer,
    # so a row copy duplicates all of a slot's rings and compressor state, or a block's entries.
    def copy_slot(self, src: int, dst: int) -> None:
        self.slots[dst] = self.slots[src]

    def copy_blocks(self, src: list[int], dst: list[int]) -> None:
        self.blocks[torch.tensor(dst, device=self.blocks.device)] = self.blocks[
            torch.tensor(src, device=self.blocks.device)
        ]
