"""Weights as layer ops receive them: backend-independent containers of backend-prepared objects.

A backend turns checkpoint tensors into its own objects once at load (`prepare_linear`,
`prepare_experts`); the model holds those and passes them back to the ops that consume them
(`linear`, `moe`). Only the backend that prepared an object may read it, which is why the
registry keeps those ops together (registry.OP_GROUPS).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class MoEWeights:
    """One MoE sub-layer: router, prepared routed experts and the prepared shared-expert linears."""

    gate: torch.Tensor  # [E, H] router weight (BF16/F32), logits computed in FP32
    bias: torch.Tensor  # [E] selection bias of text tokens
    bias_vl: torch.Tensor  # [E] selection bias of image tokens
    experts: Any  # prepare_experts(...) of the stacked routed experts
    shared_w1: Any  # prepare_linear(...) of the shared expert's gate [I, H]
    shared_w3: Any  # ... up [I, H]
    shared_w2: Any  # ... down [H, I]
    topk: int
    route_scale: float  # routed_scaling_factor, applied after normalising the selected scores
    swiglu_limit: float
    dtype: torch.dtype  # compute dtype of the experts and of the result
