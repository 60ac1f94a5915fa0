"""Lightning-indexer scores (model spec §6.5)."""

from __future__ import annotations

import torch


def indexer_logits(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """I[t, j] = sum_h w[t, h] * relu(q[t, h] . k[j]) -> float32 [T, N].

    q [T, heads, D], k [N, D], weights [T, heads]. Per-head products and weighted terms are rounded
    to the input dtype (BF16 in the release kernels) before the float32 sum over heads.
    """
    dots = torch.einsum("thd,nd->thn", q, k.to(q.dtype)).relu()
    return (dots * weights.to(q.dtype).unsqueeze(-1)).float().sum(dim=1)
