"""Lightning-indexer scores (model spec §6.5)."""

from __future__ import annotations

import torch

# Query rows per block: bounds the [rows, heads, keys] intermediate on long prefills.
_ROW_BLOCK = 256


def indexer_logits(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """I[t, j] = sum_h w[t, h] * relu(q[t, h] . k[j]) -> float32 [T, N].

    q [T, heads, D], k [N, D], weights [T, heads]. Per-head products and weighted terms are rounded
    to the input dtype (BF16 in the release kernels) before the float32 sum over heads.
    """
    out = torch.empty(q.shape[0], k.shape[0], dtype=torch.float32, device=q.device)
    k = k.to(q.dtype)
    for b in range(0, q.shape[0], _ROW_BLOCK):
        dots = torch.einsum("thd,nd->thn", q[b : b + _ROW_BLOCK], k).relu()
        w = weights[b : b + _ROW_BLOCK].to(q.dtype).unsqueeze(-1)
        out[b : b + _ROW_BLOCK] = (dots * w).float().sum(dim=1)
    return out
