"""RoPE frequency tables per layer kind (model spec §6.3): θ per layer, YaRN ramp on compressed layers."""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass

import torch

from deepinfer.config import LayerSpec, RopeScaling, TextConfig


def rope_frequencies(dim: int, theta: float, yarn: RopeScaling | None = None) -> torch.Tensor:
    """float32 [dim / 2] angular frequencies; YaRN blends towards f / factor (frequency only, no mscale)."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    if yarn is None:
        return freqs

    def bound(beta: float) -> float:
        return (
            dim
            * math.log(yarn.original_max_position_embeddings / (2 * math.pi * beta))
            / (2 * math.log(theta))
        )

    low = max(math.floor(bound(yarn.beta_fast)), 0)
    high = min(math.ceil(bound(yarn.beta_slow)), dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / max(high - low, 1e-3)).clamp(0, 1)
    return freqs * (1 - ramp) + freqs / yarn.factor * ramp


@dataclass(frozen=True)
class Rope:
    freqs: torch.Tensor  # float32 [rope_dim / 2]
    key: Hashable  # equal keys: equal freqs (one model's layers with the same θ and YaRN flag)

    @classmethod
    def for_layer(cls, cfg: TextConfig, spec: LayerSpec, device: torch.device | str = "cpu") -> Rope:
        yarn = cfg.rope_scaling if spec.uses_yarn else None
        freqs = rope_frequencies(cfg.qk_rope_head_dim, spec.rope_theta, yarn).to(device)
        return cls(freqs, (spec.rope_theta, spec.uses_yarn))

    def angles(self, positions: torch.Tensor) -> torch.Tensor:
        """Absolute positions [n] -> float32 angles [n, rope_dim / 2] (integer positions promote to
        float32 inside the one multiply: the same values as converting first, one launch fewer)."""
        return positions.unsqueeze(-1) * self.freqs
