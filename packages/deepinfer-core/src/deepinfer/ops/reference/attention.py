"""Sparse attention with a per-head sink (model spec §6.7): over a gathered KV buffer, and over the
paged cache (SWA ring + compressed pool) for every row of a step at once; the incremental KV
compressor pooling (§6.4) that appends to that pool."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from deepinfer.ops.reference.cache_quant import QUANT_OPS

if TYPE_CHECKING:
    from deepinfer.cache.codecs import Codec

# Query rows per block: bounds the [rows, keys, dim] gather on long prefills.
_ROW_BLOCK = 256


def _attend(
    q: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, sink: torch.Tensor, scale: float
) -> torch.Tensor:
    """Softmax over keys [t, K, D] (float32, K = V) and the sink logit; valid [t, K] bool. -> float32."""
    logits = torch.einsum("thd,tkd->thk", q.float(), keys) * scale
    logits = logits.masked_fill(~valid.unsqueeze(1), -torch.inf)
    sinks = sink.float().view(1, -1, 1).expand(logits.shape[0], -1, 1)
    probs = torch.cat((logits, sinks), dim=-1).softmax(dim=-1)[..., :-1]
    return torch.einsum("thk,tkd->thd", probs, keys)


def sparse_attention_sink(
    q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sink: torch.Tensor, scale: float
) -> torch.Tensor:
    """o[t, h] = sum_k softmax_k(q[t, h] . kv[i_tk] * scale | sink[h]) kv[i_tk], in float32.

    q [T, heads, D]; kv [N, D] (one shared K=V head); indices [T, K] into kv, -1 = no key; sink [heads]
    is an extra logit with a zero value. Returns [T, heads, D] in q's dtype.
    """
    out = torch.empty_like(q)
    kvf = kv.float()
    for b in range(0, q.shape[0], _ROW_BLOCK):
        idx = indices[b : b + _ROW_BLOCK]
        o = _attend(q[b : b + _ROW_BLOCK], kvf[idx.clamp_min(0)], idx >= 0, sink, scale)
        out.narrow(0, b, o.shape[0]).copy_(o)
    return out


def sparse_attention_paged(
    q: torch.Tensor,
    kv: torch.Tensor,
    ring: torch.Tensor,
    ring_codec: Codec,
    window: torch.Tensor,
    ring_dest: torch.Tensor,
    ring_src: torch.Tensor,
    sink: torch.Tensor,
    scale: float,
    *,
    pool: torch.Tensor | None = None,
    pool_codec: Codec | None = None,
    topk: torch.Tensor | None = None,
    block_tables: torch.Tensor | None = None,
    row_seg: torch.Tensor | None = None,
) -> torch.Tensor:
    """One attention layer over every row of a step: window keys + selected compressed entries + sink.

    q [T, heads, D] rotated queries; kv [T, D] this step's window keys (= values) of the same rows,
    before the cache codec. ring [S, L, nbytes] uint8: the layer's SWA ring region of every slot
    (position p of slot s at ring row s * L + p % L), stored with `ring_codec`.
    window [T, W] long, per row its window keys: r < S * L reads ring row r, r >= S * L reads this
    step's key of row r - S * L (encoded and decoded with `ring_codec`, like a cached key), -1 none.
    After reading, stores encode(kv)[ring_src] at ring rows ring_dest ([n] long each).
    Compressed (all given or none): pool [num_blocks, E, nbytes] uint8 of the KV source, `pool_codec`;
    topk [T, K] long entry ids of the row's sequence (-1 none); entry j of sequence b lives at
    pool[block_tables[b, j // E], j % E]; row_seg [T] long = the sequence b of each row.
    Keys are window first then compressed, one softmax with the per-head sink logit (zero value):
    o = sum_k softmax_k(q . key_k * scale | sink) key_k in float32. Returns [T, heads, D] in q's dtype.
    """
    ring_len = ring.shape[1]
    ring_rows = ring.shape[0] * ring_len
    encoded = ring_codec.encode(kv, QUANT_OPS)
    out = torch.empty_like(q)
    for b in range(0, q.shape[0], _ROW_BLOCK):
        rows = slice(b, b + _ROW_BLOCK)
        idx = window[rows]
        in_ring = idx.clamp(0, ring_rows - 1)
        current = (idx - ring_rows).clamp(0, kv.shape[0] - 1)
        cached = ring[in_ring // ring_len, in_ring % ring_len]
        raw = torch.where((idx >= ring_rows).unsqueeze(-1), encoded[current], cached)
        keys = ring_codec.decode(raw.flatten(0, 1), QUANT_OPS).unflatten(0, idx.shape).float()
        valid = idx >= 0
        if pool is not None:
            sel = topk[rows]
            entries = sel.clamp_min(0)
            per_block = pool.shape[1]
            blocks = block_tables[row_seg[rows]].gather(1, entries // per_block)
            comp = pool_codec.decode(pool[blocks, entries % per_block].flatten(0, 1), QUANT_OPS)
            keys = torch.cat((keys, comp.unflatten(0, sel.shape).float()), dim=1)
            valid = torch.cat((valid, sel >= 0), dim=1)
        out.narrow(0, b, idx.shape[0]).copy_(_attend(q[rows], keys, valid, sink, scale))
    ring.index_put_((ring_dest // ring_len, ring_dest % ring_len), encoded[ring_src])
    return out


def compressor_update(
    gate_value: torch.Tensor,
    state: torch.Tensor,
    sources: torch.Tensor,
    state_dest: torch.Tensor,
    state_src: torch.Tensor,
) -> torch.Tensor:
    """Softmax-gated pooling of the groups completed in this step, then the state ring update.

    gate_value [T, 2D] float32: per row of the step (gate scores, values) of the compressor's two
    projections. state [S, Lc, 2D * 4] uint8: the layer's compressor ring region of every slot, raw
    float32 (position p of slot s at ring row s * Lc + p % Lc). sources [M, ratio] long: the rows of
    each completed group in position order, r < S * Lc = ring row r, r >= S * Lc = step row
    r - S * Lc. Returns pooled [M, D] float32, pooled[m] = sum_i softmax_i(gate[m, i]) * value[m, i]
    (per channel). Afterwards stores gate_value[state_src] at ring rows state_dest ([n] long each).
    """
    ring_len = state.shape[1]
    ring_rows = state.shape[0] * ring_len
    in_ring = sources.clamp(0, ring_rows - 1)
    current = (sources - ring_rows).clamp(0, gate_value.shape[0] - 1)
    cached = state[in_ring // ring_len, in_ring % ring_len].view(torch.float32)
    pending = torch.where((sources >= ring_rows).unsqueeze(-1), gate_value[current], cached)
    gate, value = pending.chunk(2, dim=-1)  # [M, ratio, D] each
    pooled = (value * gate.softmax(dim=1)).sum(dim=1)
    state.index_put_((state_dest // ring_len, state_dest % ring_len), gate_value[state_src].view(torch.uint8))
    return pooled
