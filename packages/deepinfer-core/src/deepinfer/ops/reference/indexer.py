"""Lightning-indexer scores (model spec §6.5) and the per-row top-k selection over the paged pool."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from deepinfer.ops.reference.cache_quant import QUANT_OPS

if TYPE_CHECKING:
    from deepinfer.cache.codecs import Codec

# Query rows per block: bounds the [rows, heads, keys] intermediate on long prefills.
_ROW_BLOCK = 256


def _weighted_relu(dots: torch.Tensor, weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """sum_h w[t, h] * relu(dots[t, h, n]): products rounded to `dtype`, the head sum in float32."""
    return (dots.relu() * weights.to(dtype).unsqueeze(-1)).float().sum(dim=1)


def indexer_logits(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """I[t, j] = sum_h w[t, h] * relu(q[t, h] . k[j]) -> float32 [T, N].

    q [T, heads, D], k [N, D], weights [T, heads]. Per-head products and weighted terms are rounded
    to the input dtype (BF16 in the release kernels) before the float32 sum over heads.
    """
    out = torch.empty(q.shape[0], k.shape[0], dtype=torch.float32, device=q.device)
    k = k.to(q.dtype)
    for b in range(0, q.shape[0], _ROW_BLOCK):
        dots = torch.einsum("thd,nd->thn", q[b : b + _ROW_BLOCK], k)
        out.narrow(0, b, dots.shape[0]).copy_(_weighted_relu(dots, weights[b : b + _ROW_BLOCK], q.dtype))
    return out


def candidate_blocks(
    scores: torch.Tensor, visible: torch.Tensor, topk_blocks: int, block: int
) -> torch.Tensor:
    """Entry mask of the `topk_blocks` best blocks (max-pooled scores), the latest visible block forced in.

    scores [n, N] with -inf at invisible entries; visible [n] = visible entry count per row.
    """
    width = scores.shape[-1]
    pooled = torch.nn.functional.pad(scores, (0, -width % block), value=-torch.inf)
    pooled = pooled.unflatten(-1, (-1, block)).amax(-1)
    latest = ((visible - 1) // block).unsqueeze(-1)  # -1 when nothing is visible: forces no block
    pooled = pooled.masked_fill(torch.arange(pooled.shape[-1], device=scores.device) == latest, torch.inf)
    best = pooled.topk(min(topk_blocks, pooled.shape[-1]), dim=-1)
    keep = torch.zeros_like(pooled, dtype=torch.bool).scatter(-1, best.indices, best.values > -torch.inf)
    return keep.repeat_interleave(block, dim=-1)[:, :width] & torch.isfinite(scores)


def indexer_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    pool: torch.Tensor,
    codec: Codec,
    block_tables: torch.Tensor,
    row_seg: torch.Tensor,
    visible: torch.Tensor,
    capacity: int,
    k: int,
    *,
    allowed: torch.Tensor | None = None,
    candidates: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each row's top-k visible compressed entries of its own sequence, read from the paged pool.

    q [T, heads, D] indexer queries; weights [T, heads]; pool [num_blocks, E, nbytes] uint8 index
    keys of the KV source (entry j of sequence b at pool[block_tables[b, j // E], j % E]), `codec`;
    row_seg [T] long = each row's sequence; visible [T] long = its visible entry count (entries
    [0, visible) score, the rest are -inf); capacity (host int) >= every visible count: the score width.
    Scores are `indexer_logits` of the row against its sequence's keys. `allowed` [T, capacity] bool
    further restricts the entries (Reindex layers: the candidate mask); `candidates` = (topk_blocks,
    block) makes this a candidate source, which also returns the `candidate_blocks` mask
    [T, capacity] of its scores. Returns (top-k [T, k] long: the k best entry ids in ascending order,
    then -1 where fewer than k are visible/allowed; candidate mask or None).
    """
    rows, width = q.shape[0], max(capacity, k)
    per_block = pool.shape[1]
    entries = torch.arange(capacity, device=q.device)
    blocks = block_tables[:, entries // per_block]  # [B, capacity]
    seq_keys = codec.decode(pool[blocks, entries % per_block].flatten(0, 1), QUANT_OPS)
    seq_keys = seq_keys.unflatten(0, blocks.shape).to(q.dtype)  # [B, capacity, D]
    top = torch.empty(rows, k, dtype=torch.long, device=q.device)
    mask = torch.empty(rows, capacity, dtype=torch.bool, device=q.device) if candidates else None
    for b in range(0, rows, _ROW_BLOCK):
        r = slice(b, b + _ROW_BLOCK)
        dots = torch.einsum("thd,tnd->thn", q[r], seq_keys[row_seg[r]])
        scores = _weighted_relu(dots, weights[r], q.dtype)
        scores = scores.masked_fill(entries >= visible[r].unsqueeze(-1), -torch.inf)
        if candidates is not None:
            mask.narrow(0, b, scores.shape[0]).copy_(candidate_blocks(scores, visible[r], *candidates))
        if allowed is not None:
            scores = scores.masked_fill(~allowed[r], -torch.inf)
        scores = torch.nn.functional.pad(scores, (0, width - capacity), value=-torch.inf)
        best = scores.topk(k, dim=-1, sorted=False).indices
        # canonical order: selected ids ascending, then the -1 padding (misses sort last as `width`)
        best = torch.where(torch.isfinite(scores.gather(-1, best)), best, width).sort(dim=-1).values
        top.narrow(0, b, best.shape[0]).copy_(torch.where(best < width, best, -1))
    return top, mask
