"""Engram hashed n-gram memory: row hashing, FP8 table lookup and the stream gate."""

from __future__ import annotations

import torch

from deepinfer.checkpoint.formats import dequantize_fp8_rows


def engram_hash(
    ngrams: torch.Tensor, multipliers: torch.Tensor, primes: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    """Table rows [T, (N-1)*heads] of n-gram ids [T, N] (x_0 = current token, pads already applied).

    p_s = x_s * mu_s; the order-n hash is p_0 ^ ... ^ p_{n-1}; row = hash mod prime + offset, with
    primes/offsets [N-1, heads] in (order, head) order.
    """
    products = ngrams.long() * multipliers.long()
    rolling, rows = products[:, 0], []
    for shift in range(1, ngrams.shape[1]):
        rolling = torch.bitwise_xor(rolling, products[:, shift])
        rows.append(rolling.unsqueeze(-1) % primes[shift - 1] + offsets[shift - 1])
    return torch.cat(rows, dim=-1)


def engram_lookup(
    table: torch.Tensor, scale: torch.Tensor, rows: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Gather FP8 rows [T, heads] of a [N, D] table with [N, D/32] scales -> [T, heads * D] in dtype."""
    flat = rows.reshape(-1)
    data = dequantize_fp8_rows(table[flat], scale[flat], dtype)
    return data.reshape(*rows.shape[:-1], -1)


def engram_gate(
    streams: torch.Tensor,
    keys: torch.Tensor,
    value: torch.Tensor,
    weights: torch.Tensor,
    token_mask: torch.Tensor | None,
    eps: float,
) -> torch.Tensor:
    """R_i += g_i * v with g_i = sigmoid(signed sqrt of a normalised <R_i, w_i * k_i> / sqrt(H)).

    streams [T, m, H], keys [T, m, H], value [T, H], weights [m, H]; token_mask False -> gate 0.
    """
    hidden = streams.float()
    k = keys.float()
    rstd = torch.rsqrt(hidden.square().mean(-1) + eps) * torch.rsqrt(k.square().mean(-1) + eps)
    dot = (hidden * weights.float() * k).sum(-1) * rstd * hidden.shape[-1] ** -0.5
    gate = torch.sigmoid(torch.copysign(dot.abs().clamp_min(1e-6).sqrt(), dot))
    if token_mask is not None:
        gate = gate.masked_fill(~token_mask.unsqueeze(-1), 0)
    return (hidden + gate.unsqueeze(-1) * value.float().unsqueeze(-2)).to(streams.dtype)
