"""Sparse attention with a per-head sink over a gathered KV buffer (model spec §6.7)."""

from __future__ import annotations

import torch

# Query rows per block: bounds the [rows, keys, dim] gather on long prefills.
_ROW_BLOCK = 256


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
        keys = kvf[idx.clamp_min(0)]  # [t, K, D]
        logits = torch.einsum("thd,tkd->thk", q[b : b + _ROW_BLOCK].float(), keys) * scale
        logits = logits.masked_fill((idx < 0).unsqueeze(1), -torch.inf)
        sinks = sink.float().view(1, -1, 1).expand(logits.shape[0], -1, 1)
        probs = torch.cat((logits, sinks), dim=-1).softmax(dim=-1)[..., :-1]
        out[b : b + _ROW_BLOCK] = torch.einsum("thk,tkd->thd", probs, keys).to(q.dtype)
    return out
