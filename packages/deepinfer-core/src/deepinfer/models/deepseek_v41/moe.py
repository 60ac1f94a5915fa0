"""MoE FFN: sqrtsoftplus router with selection bias (bias_vl for image tokens), normalised top-k with
routed scaling, MXFP4 routed experts with clamped SwiGLU, and one FP8 shared expert.

The whole sub-layer is the backend's `moe` op; this module loads its weights once: the per-expert
checkpoint tensors are stacked into [E, ...] and handed to `prepare_experts`. Under expert parallelism
(an active `deepinfer.distributed` state) a backbone layer stacks only this rank's expert slots and
runs through `ExpertParallel`, which exchanges tokens with the other ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from deepinfer.config import TextConfig
from deepinfer.distributed.expert_parallel import ExpertParallel
from deepinfer.distributed.state import parallel_state, shards_experts
from deepinfer.models.deepseek_v41.linear import check_scale, make_linear
from deepinfer.models.deepseek_v41.weights import WeightError, Weights
from deepinfer.ops import Ops
from deepinfer.ops.weights import MoEWeights

_EXPERT_TENSORS = ("w1", "w3", "w2")


def stacked_experts(w: Weights, experts: Sequence[int], hidden: int, inter: int) -> dict[str, torch.Tensor]:
    """`w1`, `w1_scale`, `w3`, ... as [len(experts), ...] stacks of the checked per-expert packed FP4
    tensors of `experts` (an expert may repeat: a redundant slot); the per-expert tensors are released
    from a mutable `w` (so the experts are not held twice)."""
    shapes = {"w1": (inter, hidden), "w3": (inter, hidden), "w2": (hidden, inter)}
    out: dict[str, torch.Tensor] = {}
    for key in _EXPERT_TENSORS:
        rows, cols = shapes[key]
        packed, scales = [], []
        for e in experts:
            name = f"experts.{e}.{key}"
            t = w.get(f"{name}.weight", (rows, cols // 2))
            if t.dtype not in (torch.int8, torch.uint8):
                raise WeightError(f"{w.name(name)}.weight: dtype {t.dtype}, expected I8 (packed FP4)")
            packed.append(t)
            scales.append(check_scale(w, f"{name}.scale", (rows, cols // 32)))
        out[key], out[f"{key}_scale"] = torch.stack(packed), torch.stack(scales)
        del packed, scales
        w.release([f"experts.{e}.{key}.{part}" for e in sorted(set(experts)) for part in ("weight", "scale")])
    return out


@dataclass
class MoE:
    """One MoE sub-layer: its prepared weights and the ops that run it."""

    weights: MoEWeights
    ops: Ops
    ep: ExpertParallel | None = None  # expert parallelism: this rank holds only its slots' experts

    @classmethod
    def load(
        cls, w: Weights, cfg: TextConfig, n_experts: int, topk: int, ops: Ops, dtype: torch.dtype
    ) -> MoE:
        h, i = cfg.hidden_size, cfg.moe_intermediate_size
        shared = {k: make_linear(w, f"shared_experts.{k}", ops, dtype, s)
                  for k, s in (("w1", (i, h)), ("w3", (i, h)), ("w2", (h, i)))}
        par = parallel_state() if shards_experts(w.prefix) else None
        ep = None
        if par is None:
            stacks = stacked_experts(w, range(n_experts), h, i)
        else:
            placement = par.placement(n_experts)
            stacks = stacked_experts(w, placement.local_logical(par.rank), h, i)
            ep = ExpertParallel(placement, par.rank, par.group, stacks)
        layer = MoEWeights(
            gate=w.get("gate.weight", (n_experts, h)),
            bias=w.get("gate.bias", (n_experts,)),
            bias_vl=w.get("gate.bias_vl", (n_experts,)),
            experts=ops.prepare_experts(**stacks),
            shared_w1=shared["w1"].prepared,
            shared_w3=shared["w3"].prepared,
            shared_w2=shared["w2"].prepared,
            topk=topk,
            route_scale=cfg.routed_scaling_factor,
            swiglu_limit=cfg.swiglu_limit,
            dtype=dtype,
        )
        return cls(layer, ops, ep)

    def __call__(self, x: torch.Tensor, image_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.ep is not None:
            return self.ep(x, self.weights, self.ops, image_mask)
        return self.ops.moe(x, self.weights, image_mask)
