"""Manifold-constrained hyper-connections (mHC): coefficients, collapse and expansion of the streams.

Streams have shape [T, m, H]. All coefficients are FP32: pre/post [T, m], comb [T, m_in, m_out].
`hc_collapse_norm` and `hc_residual` are compositions that kernel backends fuse.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from deepinfer.ops.reference.norm import rms_norm


def sinkhorn(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Approximately doubly stochastic [.., m, m]: row softmax, then alternate column/row scaling."""
    x = logits.softmax(dim=-1) + eps
    x = x / (x.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        x = x / (x.sum(dim=-1, keepdim=True) + eps)
        x = x / (x.sum(dim=-2, keepdim=True) + eps)
    return x


def hc_coefficients(
    streams: torch.Tensor,
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    sinkhorn_iters: int,
    hc_eps: float,
    norm_eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pre, post, comb) of one sub-layer from the streams entering it (projection before RMS)."""
    m = streams.shape[-2]
    flat = streams.flatten(-2).float()
    mix = F.linear(flat, fn.float()) * torch.rsqrt(flat.square().mean(-1, keepdim=True) + norm_eps)
    s = scale.float()
    scales = torch.cat((s[0].expand(m), s[1].expand(m), s[2].expand(m * m)))
    z = torch.addcmul(base.float(), mix, scales)
    pre = torch.sigmoid(z[..., :m]) + hc_eps
    post = 2 * torch.sigmoid(z[..., m : 2 * m])
    comb = sinkhorn(z[..., 2 * m :].unflatten(-1, (m, m)), sinkhorn_iters, hc_eps)
    return pre, post, comb


def hc_collapse(streams: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """Weighted sum of the streams [T, m, H] with pre [T, m] (FP32 accumulation) -> [T, H]."""
    return (pre.unsqueeze(-1) * streams.float()).sum(-2).to(streams.dtype)


def hc_expand(
    output: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor
) -> torch.Tensor:
    """New streams: R'[k] = post[k] * y + sum_j comb[j, k] * R[j], in the output's dtype."""
    update = post.unsqueeze(-1) * output.unsqueeze(-2)
    mixed = (comb.unsqueeze(-1) * streams.unsqueeze(-2)).sum(-3)
    return (update + mixed).to(output.dtype)


def hc_collapse_norm(
    streams: torch.Tensor, pre: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """A sub-layer's normed input: RMSNorm of the collapse -> [T, H] in the streams' dtype."""
    return rms_norm(hc_collapse(streams, pre), weight, eps)


def hc_residual(
    output: torch.Tensor,
    streams: torch.Tensor,
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    sinkhorn_iters: int,
    hc_eps: float,
    norm_eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(new streams, pre): the sub-layer's coefficients from the streams entering it, its output expanded
    into them with post and comb; pre is carried to the next sub-layer (shifted mHC)."""
    pre, post, comb = hc_coefficients(streams, fn, base, scale, sinkhorn_iters, hc_eps, norm_eps)
    return hc_expand(output, streams, post, comb), pre
