"""Mixture-of-experts: sqrtsoftplus routing with selection bias, and MXFP4 routed experts."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from deepinfer.checkpoint.formats import dequantize_fp4


def moe_route(
    logits: torch.Tensor,
    bias: torch.Tensor,
    bias_vl: torch.Tensor,
    image_mask: torch.Tensor | None,
    topk: int,
    route_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (weights [T, k] float32, expert ids [T, k] int64).

    The bias only changes which experts are selected (noaux_tc); weights are the selected
    sqrtsoftplus scores normalised to sum 1, times `route_scale`. Image tokens use `bias_vl`.
    """
    scores = torch.sqrt(F.softplus(logits.float()))
    sel_bias = bias.float().expand_as(scores)
    if image_mask is not None:
        sel_bias = torch.where(image_mask.unsqueeze(-1), bias_vl.float(), sel_bias)
    ids = (scores + sel_bias).topk(topk, dim=-1).indices
    weights = scores.gather(-1, ids)
    weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * route_scale, ids


def swiglu_clamped(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """silu(min(gate, limit)) * clamp(up, -limit, limit), in float32."""
    return F.silu(gate.float().clamp(max=limit)) * up.float().clamp(-limit, limit)


def moe_experts_fp4(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    w1: Sequence[torch.Tensor],
    w1_scale: Sequence[torch.Tensor],
    w3: Sequence[torch.Tensor],
    w3_scale: Sequence[torch.Tensor],
    w2: Sequence[torch.Tensor],
    w2_scale: Sequence[torch.Tensor],
    swiglu_limit: float,
) -> torch.Tensor:
    """Sum over selected experts of weight * W2 (swiglu(W1 x, W3 x)); per-expert packed weights
    (indexable by expert id: a list, or a stacked [E, ...] tensor).

    Products run in x's dtype; the routing weight multiplies the activation before W2 and the sum
    over experts accumulates in float32. Returns [T, H] in x's dtype.
    """
    dtype = x.dtype
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in torch.unique(ids).tolist():
        tok, slot = torch.where(ids == e)
        xe = x[tok]
        gate = F.linear(xe, dequantize_fp4(w1[e], w1_scale[e], dtype=dtype))
        up = F.linear(xe, dequantize_fp4(w3[e], w3_scale[e], dtype=dtype))
        act = (swiglu_clamped(gate, up, swiglu_limit) * weights[tok, slot].unsqueeze(-1)).to(dtype)
        out.index_add_(0, tok, F.linear(act, dequantize_fp4(w2[e], w2_scale[e], dtype=dtype)).float())
    return out.to(dtype)
