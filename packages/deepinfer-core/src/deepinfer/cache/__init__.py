"""Paged compressed-KV / index-key pool and per-sequence state slots (model spec §15)."""

from deepinfer.cache.codecs import Codec
from deepinfer.cache.layout import BLOCK_TOKENS, CachePrecision, CacheSpec, cache_layout, cache_spec
from deepinfer.cache.pool import KVCache, PagedEntries, Ring

__all__ = [
    "BLOCK_TOKENS",
    "CachePrecision",
    "CacheSpec",
    "Codec",
    "KVCache",
    "PagedEntries",
    "Ring",
    "cache_layout",
    "cache_spec",
]
