"""The allocated cache: a paged block pool and per-sequence state slots, both raw bytes.

Block 0 and slot 0 are padding and never hold a sequence. Layer ops read and write the typed region
views: `PagedEntries` (compressed KV / index keys, entry j of a sequence at block_table[j // E], j % E)
and `Ring` (per-slot rings, position p at entry p mod the ring length); docs/architecture.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer.cache.codecs import Codec
from deepinfer.cache.layout import CachePrecision, CacheSpec, Region, RegionKind, cache_spec
from deepinfer.config import TextConfig


def _view(storage: torch.Tensor, region: Region) -> torch.Tensor:
    span = region.entries * region.codec.nbytes
    rows = storage[:, region.offset : region.offset + span]
    return rows.unflatten(1, (region.entries, region.codec.nbytes))


@dataclass
class PagedEntries:
    """Entries of one stream: entry j of a sequence lives in block block_table[j // E] at j % E."""

    data: torch.Tensor  # [num_blocks, E, nbytes] view into the pool
    codec: Codec


@dataclass
class Ring:
    """Per-slot ring: position p of the slot's sequence lives at entry p mod len."""

    data: torch.Tensor  # [num_slots, len, nbytes] view into the slot storage
    codec: Codec

    @property
    def length(self) -> int:
        return self.data.shape[1]


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
    ):
        if num_blocks < 2 or num_slots < 2:
            raise ValueError("need at least one usable block and slot besides padding block 0 / slot 0")
        self.spec: CacheSpec = cache_spec(cfg, precision, dtype, max_backtrack)
        self.precision, self.dtype, self.max_backtrack = precision, dtype, max_backtrack
        self.blocks = torch.zeros(num_blocks, self.spec.bytes_per_block, dtype=torch.uint8, device=device)
        self.slots = torch.zeros(num_slots, self.spec.bytes_per_slot, dtype=torch.uint8, device=device)
        # typed region views, built once (layers ask for theirs every step)
        self._views: dict[tuple[RegionKind, int], PagedEntries | Ring] = {}

    def _block_region(self, kind: RegionKind, layer: int) -> PagedEntries:
        if (kind, layer) not in self._views:
            region = self.spec.block_regions[(kind, layer)]
            self._views[(kind, layer)] = PagedEntries(_view(self.blocks, region), region.codec)
        return self._views[(kind, layer)]

    def _slot_region(self, kind: RegionKind, layer: int) -> Ring:
        if (kind, layer) not in self._views:
            region = self.spec.slot_regions[(kind, layer)]
            self._views[(kind, layer)] = Ring(_view(self.slots, region), region.codec)
        return self._views[(kind, layer)]

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
        # non-blocking: a blocking host->device index copy would synchronise the step stream
        dst_t, src_t = (torch.tensor(i).to(self.blocks.device, non_blocking=True) for i in (dst, src))
        self.blocks.index_copy_(0, dst_t, self.blocks.index_select(0, src_t))
