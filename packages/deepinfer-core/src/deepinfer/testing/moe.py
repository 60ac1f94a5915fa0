"""A toy MoE sub-layer (random FP4 routed experts, an FP8 shared expert) that a backend's kernels and the
reference op both prepare, for kernel tests at tiny shapes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from deepinfer.checkpoint.formats import quantize_fp4, quantize_fp8
from deepinfer.ops.weights import MoEWeights

Layer = Callable[[Callable[..., Any], Callable[..., Any]], MoEWeights]


def toy_experts(experts: int, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One [rows, cols] FP4 projection per expert, stacked: `quantize_fp4`'s (weights, scales) with an
    expert axis first, drawn from torch's global generator."""
    q = [quantize_fp4(torch.randn(rows, cols) * 0.1) for _ in range(experts)]
    return torch.stack([w for w, _ in q]), torch.stack([s for _, s in q])


def toy_moe(experts: int, hidden: int, inter: int, topk: int) -> tuple[Layer, dict[str, Any]]:
    """Draws the weights from torch's global generator (the caller seeds it) and returns
    `layer(prepare_experts, prepare_linear)`, the MoEWeights prepared by those two functions, and the
    fields that are not prepared (router gate, biases, top-k, scale, limit; float32 compute)."""
    w1, w3, w2 = (toy_experts(experts, inter, hidden), toy_experts(experts, inter, hidden),
                  toy_experts(experts, hidden, inter))
    shared = [quantize_fp8(torch.randn(*shape) * 0.1) for shape in ((inter, hidden), (inter, hidden),
                                                                    (hidden, inter))]
    common = dict(gate=torch.randn(experts, hidden).bfloat16(), bias=torch.randn(experts) * 0.1,
                  bias_vl=torch.randn(experts) * 0.1, topk=topk, route_scale=2.5, swiglu_limit=1.0,
                  dtype=torch.float32)

    def layer(prepare_experts: Callable[..., Any], prepare_linear: Callable[..., Any]) -> MoEWeights:
        return MoEWeights(experts=prepare_experts(*w1, *w3, *w2), shared_w1=prepare_linear("fp8", *shared[0]),
                          shared_w3=prepare_linear("fp8", *shared[1]),
                          shared_w2=prepare_linear("fp8", *shared[2]), **common)

    return layer, common
