"""Which layer stores what, where, in how many bytes (model spec §15.1-15.2).

Paged block (128 raw tokens): for every KV-source layer, its compressed KV entries, then its index
keys (128 / ratio entries each); consumer layers alias their source. State slot: one SWA ring of
W + max_backtrack entries per backbone and DSpark layer (position p at entry p mod ring), then one
float32 compressor ring of ratio - 1 + max_backtrack (gate score, value) pairs per ratio>1 KV source.
Every region is padded to 32 bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from deepinfer.cache.codecs import Codec
from deepinfer.config import TextConfig
from deepinfer.models.interface import CacheLayout

BLOCK_TOKENS = 128
ALIGN = 32
CachePrecision = Literal["exact", "release"]
RegionKind = Literal["kv", "index", "window", "compressor"]


@dataclass(frozen=True)
class Region:
    kind: RegionKind
    layer: int
    offset: int  # bytes into the block or slot
    entries: int
    codec: Codec

    @property
    def nbytes(self) -> int:
        return -(-self.entries * self.codec.nbytes // ALIGN) * ALIGN


@dataclass(frozen=True)
class CacheSpec:
    precision: CachePrecision
    max_backtrack: int
    block_regions: dict[tuple[RegionKind, int], Region]
    slot_regions: dict[tuple[RegionKind, int], Region]

    @property
    def bytes_per_block(self) -> int:
        return sum(r.nbytes for r in self.block_regions.values())

    @property
    def bytes_per_slot(self) -> int:
        return sum(r.nbytes for r in self.slot_regions.values())

    def layout(self) -> CacheLayout:
        return CacheLayout(BLOCK_TOKENS, self.bytes_per_block, self.bytes_per_slot)


def _place(regions: list[tuple[RegionKind, int, int, Codec]]) -> dict[tuple[RegionKind, int], Region]:
    out, offset = {}, 0
    for kind, layer, entries, codec in regions:
        region = Region(kind, layer, offset, entries, codec)
        out[(kind, layer)] = region
        offset += region.nbytes
    return out


def cache_spec(
    cfg: TextConfig, precision: CachePrecision, dtype: torch.dtype, max_backtrack: int
) -> CacheSpec:
    if precision not in ("exact", "release"):
        raise ValueError(f"cache precision must be 'exact' or 'release', got {precision!r}")
    if max_backtrack < 1:
        raise ValueError(f"max_backtrack must be >= 1, got {max_backtrack}")
    release = precision == "release"
    d, d_index = cfg.head_dim, cfg.index_head_dim
    window = Codec("fp8" if release else "raw", d, dtype)
    if release:
        kv = Codec("nvfp4" if cfg.use_fp4_sparse_kv else "fp8", d, dtype)
        index = Codec("mxfp4", d_index, dtype)
    else:
        kv, index = Codec("raw", d, dtype), Codec("raw", d_index, dtype)

    block, slot = [], []
    for spec in cfg.layers:
        slot.append(("window", spec.index, cfg.sliding_window + max_backtrack, window))
        if spec.owns_compressor:
            block.append(("kv", spec.index, BLOCK_TOKENS // spec.compress_ratio, kv))
            block.append(("index", spec.index, BLOCK_TOKENS // spec.compress_ratio, index))
    for spec in cfg.layers:
        if spec.owns_compressor and spec.compress_ratio > 1:
            ring = spec.compress_ratio - 1 + max_backtrack
            slot.append(("compressor", spec.index, ring, Codec("raw", 2 * d, torch.float32)))
    return CacheSpec(precision, max_backtrack, _place(block), _place(slot))


def cache_layout(
    cfg: TextConfig, precision: CachePrecision, dtype: torch.dtype, max_backtrack: int
) -> CacheLayout:
    """Bytes per paged block and per state slot, for the engine's pool sizing."""
    return cache_spec(cfg, precision, dtype, max_backtrack).layout()
