"""The MoE sub-layer as one op: sqrtsoftplus routing with selection bias, MXFP4 routed experts with
clamped SwiGLU, and the shared expert.

Routed experts run two ways with the same math. On CPU each expert multiplies exactly its own tokens:
one host read of the per-expert token counts sizes the groups (host reads cost nothing there). On an
accelerator nothing may depend on tensor values, so every expert runs on every token and tokens not
routed to it are zeroed before its down projection: more arithmetic, but fixed shapes, no host
synchronisation and an op count that does not depend on the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    def dequantized(self, start: int, end: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """(w1, w3, w2) of experts [start, end) as [n, rows, cols] in `dtype`."""
        return tuple(
            dequantize_fp4(w[start:end].flatten(0, 1), s[start:end].flatten(0, 1), dtype=dtype).unflatten(
                0, (end - start, w.shape[1])
            )
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


def routed_grouped(
    x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: ReferenceExperts, limit: float
) -> torch.Tensor:
    """Sum over selected experts of weight * W2 swiglu(W1 x, W3 x), each expert on its own tokens.

    Products run in x's dtype; the routing weight multiplies the activation before W2; a token's
    expert outputs accumulate in float32 in ascending expert order. Reads the group sizes on the host.
    """
    k = ids.shape[1]
    flat = ids.flatten()
    order = flat.argsort(stable=True)  # grouped by expert, tokens ascending within a group
    sizes = torch.bincount(flat, minlength=experts.count).tolist()
    tokens = order // k
    xs, ws = x[tokens].split(sizes), weights.flatten()[order].unsqueeze(-1).split(sizes)
    outs = []
    for start in range(0, experts.count, EXPERT_CHUNK):
        w1, w3, w2 = experts.dequantized(start, min(start + EXPERT_CHUNK, experts.count), x.dtype)
        for j in range(w1.shape[0]):
            xe = xs[start + j]
            act = swiglu_clamped(F.linear(xe, w1[j]), F.linear(xe, w3[j]), limit) * ws[start + j]
            outs.append(F.linear(act.to(x.dtype), w2[j]))
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    return out.index_add_(0, tokens, torch.cat(outs).float()).to(x.dtype)


def routed_dense(
    x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: ReferenceExperts, limit: float
) -> torch.Tensor:
    """`routed_grouped` without host reads: every expert on every token, unrouted tokens zeroed."""
    t = x.shape[0]
    dense_w = torch.zeros(t, experts.count, dtype=torch.float32, device=x.device).scatter_(1, ids, weights)
    routed = torch.zeros(t, experts.count, dtype=torch.bool, device=x.device).scatter_(1, ids, True)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for start in range(0, experts.count, EXPERT_CHUNK):
        end = min(start + EXPERT_CHUNK, experts.count)
        w1, w3, w2 = experts.dequantized(start, end, x.dtype)
        act = swiglu_clamped(torch.matmul(x, w1.mT), torch.matmul(x, w3.mT), limit)  # [n, T, I]
        sel = routed[:, start:end].T.unsqueeze(-1)
        act = torch.where(sel, act * dense_w[:, start:end].T.unsqueeze(-1), 0.0)
        out += torch.matmul(act.to(x.dtype), w2.mT).float().sum(0)
    return out.to(x.dtype)


def moe(x: torch.Tensor, layer: MoEWeights, image_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The MoE sub-layer [T, H] -> [T, H] in `layer.dtype`: routed experts plus the shared expert."""
    weights, ids = route(x, layer, image_mask)
    routed_sum = routed_grouped if x.device.type == "cpu" else routed_dense
    routed = routed_sum(x.to(layer.dtype), weights, ids, layer.experts, layer.swiglu_limit)
    act = swiglu_clamped(
        linear(x, layer.shared_w1, layer.dtype), linear(x, layer.shared_w3, layer.dtype), layer.swiglu_limit
    )
    return routed + linear(act.to(layer.dtype), layer.shared_w2, layer.dtype)
