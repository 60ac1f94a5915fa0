"""The MoE sub-layer as one op: sqrtsoftplus routing with selection bias, MXFP4 routed experts with
clamped SwiGLU, and the shared expert.

Routed experts dequantise only the experts a call can touch: n = min(E, T*k) of them, the selected ids
ascending, padded with unselected experts when fewer are selected, `EXPERT_CHUNK` at a time; the op count
depends on the host-known n (its number of chunks), never on the routing. The (token, expert) pairs,
sorted by expert, then multiply their expert's weights: on CPU as grouped products over the exact groups
(one host read of the group bounds, free there); on an accelerator, where no value may reach the host and
grouped products of every dtype are not sync-free, as batched products over groups padded to T rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from deepinfer.checkpoint.formats import FP4_GROUP, dequantize_fp4
from deepinfer.ops.reference.linear import linear
from deepinfer.ops.weights import MoEWeights

# Experts dequantised at once: bounds the transient [chunk, I, H] copies at full model widths.
EXPERT_CHUNK = 16


@dataclass(frozen=True)
class ReferenceExperts:
    """Stacked routed experts in release storage: packed E2M1 int8 with UE8M0 per-32 scales."""

    w1: torch.Tensor  # gate [E, I, H/2]
    w1_scale: torch.Tensor  # [E, I, H/32]
    w3: torch.Tensor  # up [E, I, H/2]
    w3_scale: torch.Tensor
    w2: torch.Tensor  # down [E, H, I/2]
    w2_scale: torch.Tensor  # [E, H, I/32]

    @property
    def count(self) -> int:
        return self.w1.shape[0]

    def dequantized(self, experts: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """(w1, w3, w2) of the experts with ids `experts` [n] as [n, rows, cols] in `dtype`."""
        return tuple(
            dequantize_fp4(w.index_select(0, experts).flatten(0, 1), s.index_select(0, experts).flatten(0, 1),
                           dtype=dtype).unflatten(0, (experts.shape[0], w.shape[1]))
            for w, s in ((self.w1, self.w1_scale), (self.w3, self.w3_scale), (self.w2, self.w2_scale))
        )


def prepare_experts(
    w1: torch.Tensor,
    w1_scale: torch.Tensor,
    w3: torch.Tensor,
    w3_scale: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
) -> ReferenceExperts:
    """Stacked checkpoint experts -> the reference's prepared form (the same tensors, shape-checked)."""
    if w1.ndim != 3:
        raise ValueError(f"prepare_experts: w1 of shape {tuple(w1.shape)}, expected [E, I, H/2]")
    e, inter, half_h = w1.shape
    h = 2 * half_h
    want = {
        "w1": (w1, (e, inter, h // 2)),
        "w1_scale": (w1_scale, (e, inter, h // FP4_GROUP)),
        "w3": (w3, (e, inter, h // 2)),
        "w3_scale": (w3_scale, (e, inter, h // FP4_GROUP)),
        "w2": (w2, (e, h, inter // 2)),
        "w2_scale": (w2_scale, (e, h, inter // FP4_GROUP)),
    }
    for name, (t, shape) in want.items():
        if tuple(t.shape) != shape:
            raise ValueError(f"prepare_experts: {name} of shape {tuple(t.shape)}, expected {list(shape)}")
    for name in ("w1", "w3", "w2"):
        if want[name][0].dtype not in (torch.int8, torch.uint8):
            raise ValueError(f"prepare_experts: {name} dtype {want[name][0].dtype}, expected packed FP4 int8")
    return ReferenceExperts(w1, w1_scale, w3, w3_scale, w2, w2_scale)


def route(
    x: torch.Tensor, layer: MoEWeights, image_mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] float32, expert ids [T, k] int64) from FP32 router logits.

    The bias only changes which experts are selected (noaux_tc); weights are the selected
    sqrtsoftplus scores normalised to sum 1, times `route_scale`. Image tokens use `bias_vl`.
    """
    scores = torch.sqrt(F.softplus(F.linear(x.to(torch.float32), layer.gate.to(torch.float32))))
    sel_bias = layer.bias.float().expand_as(scores)
    if image_mask is not None:
        sel_bias = torch.where(image_mask.unsqueeze(-1), layer.bias_vl.float(), sel_bias)
    ids = (scores + sel_bias).topk(layer.topk, dim=-1).indices
    weights = scores.gather(-1, ids)
    weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * layer.route_scale, ids


def swiglu_clamped(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """silu(min(gate, limit)) * clamp(up, -limit, limit), in float32."""
    return F.silu(gate.float().clamp(max=limit)) * up.float().clamp(-limit, limit)


Dequantize = Callable[[int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def _expert_mlp(
    w: tuple[torch.Tensor, ...], limit: float, x: torch.Tensor, pair_weights: torch.Tensor, mm: Callable
) -> torch.Tensor:
    """W2 (swiglu(W1 x, W3 x) * weight) with `mm(a, w)` the (grouped or batched) product a @ w^T."""
    w1, w3, w2 = w
    act = swiglu_clamped(mm(x, w1), mm(x, w3), limit) * pair_weights
    return mm(act.to(x.dtype), w2)


def _grouped_products(
    x: torch.Tensor, pair_weights: torch.Tensor, sizes: torch.Tensor, dequantize: Dequantize, limit: float
) -> torch.Tensor:
    """Rows [P, H] of consecutive expert groups of `sizes` [n] -> their expert outputs [P, H]: grouped
    products over the exact groups, `EXPERT_CHUNK` experts at a time (one host read of the group bounds)."""
    bounds = [0, *sizes.cumsum(0).tolist()]
    outs = []
    for start in range(0, sizes.shape[0], EXPERT_CHUNK):
        end = min(start + EXPERT_CHUNK, sizes.shape[0])
        lo, hi = bounds[start], bounds[end]
        ends = sizes[start:end].cumsum(0).to(torch.int32)
        mm = lambda a, w, ends=ends: F.grouped_mm(a, w.mT, offs=ends)  # noqa: E731
        outs.append(_expert_mlp(dequantize(start, end), limit, x[lo:hi], pair_weights[lo:hi], mm))
    return torch.cat(outs) if outs else x.new_zeros(x.shape)


def _padded_products(
    x: torch.Tensor,
    pair_weights: torch.Tensor,
    sizes: torch.Tensor,
    dequantize: Dequantize,
    limit: float,
    capacity: int,
) -> torch.Tensor:
    """`_grouped_products` without host reads: each group padded to `capacity` rows (at least the largest
    group), batched products; pairs of other chunks go to one spare row and get zeros back."""
    rows, n = x.shape[0], sizes.shape[0]
    group = torch.repeat_interleave(torch.arange(n, device=x.device), sizes, output_size=rows)
    rank = torch.arange(rows, device=x.device) - (sizes.cumsum(0) - sizes)[group]
    out = x.new_zeros(x.shape)
    for start in range(0, n, EXPERT_CHUNK):
        end = min(start + EXPERT_CHUNK, n)
        spare = (end - start) * capacity
        slot = torch.where((group >= start) & (group < end), (group - start) * capacity + rank, spare)
        xs = x.new_zeros(spare + 1, x.shape[1]).index_copy_(0, slot, x)[:spare]
        ws = pair_weights.new_zeros(spare + 1, 1).index_copy_(0, slot, pair_weights)[:spare]
        y = _expert_mlp(
            dequantize(start, end), limit, xs.unflatten(0, (end - start, capacity)),
            ws.unflatten(0, (end - start, capacity)), lambda a, w: torch.bmm(a, w.mT),
        )
        out += torch.cat((y.flatten(0, 1), y.new_zeros(1, y.shape[-1]))).index_select(0, slot)
    return out


def routed_experts(
    x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: ReferenceExperts, limit: float
) -> torch.Tensor:
    """Sum over selected experts of weight * W2 swiglu(W1 x, W3 x), each expert on its own tokens.

    Products run in x's dtype; the routing weight multiplies the activation before W2; a token's
    expert outputs accumulate in float32 in ascending expert order.
    """
    t, k = ids.shape
    n = min(experts.count, t * k)
    flat = ids.flatten()
    counts = torch.zeros(experts.count, dtype=torch.int64, device=x.device).index_add_(
        0, flat, torch.ones_like(flat)
    )
    # selected experts ascending, then unselected ones as padding (n is at least the number selected)
    chosen = torch.argsort((counts == 0).to(torch.uint8), stable=True)[:n]
    order = flat.argsort(stable=True)  # grouped by expert, tokens ascending within a group
    tokens = order // k
    products = (
        _grouped_products if x.device.type == "cpu" else partial(_padded_products, capacity=t)
    )
    y = products(
        x.index_select(0, tokens),
        weights.flatten()[order].unsqueeze(-1),
        counts[chosen],
        lambda start, end: experts.dequantized(chosen[start:end], x.dtype),
        limit,
    )
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    return out.index_add_(0, tokens, y.float()).to(x.dtype)


def moe(x: torch.Tensor, layer: MoEWeights, image_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The MoE sub-layer [T, H] -> [T, H] in `layer.dtype`: routed experts plus the shared expert."""
    weights, ids = route(x, layer, image_mask)
    routed = routed_experts(x.to(layer.dtype), weights, ids, layer.experts, layer.swiglu_limit)
    act = swiglu_clamped(
        linear(x, layer.shared_w1, layer.dtype), linear(x, layer.shared_w3, layer.dtype), layer.swiglu_limit
    )
    return routed + linear(act.to(layer.dtype), layer.shared_w2, layer.dtype)
