"""MoE FFN: sqrtsoftplus router with selection bias (bias_vl for image tokens), normalised top-k with
routed scaling, MXFP4 routed experts with clamped SwiGLU, and one FP8 shared expert."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer.config import TextConfig
from deepinfer.models.deepseek_v41.linear import Linear, check_scale, make_linear
from deepinfer.models.deepseek_v41.weights import WeightError, Weights
from deepinfer.ops import Ops


@dataclass
class RoutedExperts:
    """Per-expert packed FP4 weights (lists indexed by expert id), never dequantised as a whole."""

    w1: list[torch.Tensor]  # gate [I, H/2]
    w1_scale: list[torch.Tensor]
    w3: list[torch.Tensor]  # up [I, H/2]
    w3_scale: list[torch.Tensor]
    w2: list[torch.Tensor]  # down [H, I/2]
    w2_scale: list[torch.Tensor]

    @classmethod
    def load(cls, w: Weights, n_experts: int, hidden: int, inter: int) -> RoutedExperts:
        shapes = {"w1": (inter, hidden), "w3": (inter, hidden), "w2": (hidden, inter)}
        out: dict[str, list[torch.Tensor]] = {
            k: [] for k in ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale")
        }
        for e in range(n_experts):
            for key, (rows, cols) in shapes.items():
                name = f"experts.{e}.{key}"
                t = w.get(f"{name}.weight", (rows, cols // 2))
                if t.dtype not in (torch.int8, torch.uint8):
                    raise WeightError(f"{w.name(name)}.weight: dtype {t.dtype}, expected I8 (packed FP4)")
                out[key].append(t)
                out[f"{key}_scale"].append(check_scale(w, f"{name}.scale", (rows, cols // 32)))
        return cls(**out)


@dataclass
class MoE:
    gate: torch.Tensor  # [E, H] BF16 router weight
    bias: torch.Tensor  # [E] selection bias for text tokens
    bias_vl: torch.Tensor  # [E] selection bias for image tokens
    experts: RoutedExperts
    shared_w1: Linear
    shared_w3: Linear
    shared_w2: Linear
    topk: int
    route_scale: float
    swiglu_limit: float
    ops: Ops
    dtype: torch.dtype

    @classmethod
    def load(
        cls, w: Weights, cfg: TextConfig, n_experts: int, topk: int, ops: Ops, dtype: torch.dtype
    ) -> MoE:
        h, i = cfg.hidden_size, cfg.moe_intermediate_size
        return cls(
            gate=w.get("gate.weight", (n_experts, h)),
            bias=w.get("gate.bias", (n_experts,)),
            bias_vl=w.get("gate.bias_vl", (n_experts,)),
            experts=RoutedExperts.load(w, n_experts, h, i),
            shared_w1=make_linear(w, "shared_experts.w1", ops, dtype, (i, h)),
            shared_w3=make_linear(w, "shared_experts.w3", ops, dtype, (i, h)),
            shared_w2=make_linear(w, "shared_experts.w2", ops, dtype, (h, i)),
            topk=topk,
            route_scale=cfg.routed_scaling_factor,
            swiglu_limit=cfg.swiglu_limit,
            ops=ops,
            dtype=dtype,
        )

    def route(self, x: torch.Tensor, image_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k] float32, expert ids [T, k]); router logits in FP32."""
        logits = self.ops.dense_linear(x, self.gate, torch.float32)
        return self.ops.moe_route(logits, self.bias, self.bias_vl, image_mask, self.topk, self.route_scale)

    def shared(self, x: torch.Tensor) -> torch.Tensor:
        act = self.ops.swiglu_clamped(self.shared_w1(x), self.shared_w3(x), self.swiglu_limit)
        return self.shared_w2(act.to(self.dtype))

    def __call__(self, x: torch.Tensor, image_mask: torch.Tensor | None = None) -> torch.Tensor:
        weights, ids = self.route(x, image_mask)
        e = self.experts
        routed = self.ops.moe_experts_fp4(
            x.to(self.dtype),
            weights,
            ids,
            e.w1,
            e.w1_scale,
            e.w3,
            e.w3_scale,
            e.w2,
            e.w2_scale,
            self.swiglu_limit,
        )
        return routed + self.shared(x)
