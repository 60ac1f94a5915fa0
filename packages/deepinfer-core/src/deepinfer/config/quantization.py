"""`quantization_config`: V4.1 ships exactly one weight format, so every field has one legal value."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

# FP8 E4M3 weights in 32x32 blocks with UE8M0 scales; routed experts FP4 E2M1 with per-32 UE8M0 scales
FP8_BLOCK = 32
FP4_GROUP = 32


class QuantizationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    quant_method: Literal["fp8"]
    expert_dtype: Literal["fp4"]
    activation_scheme: Literal["dynamic"]
    weight_block_size: tuple[Literal[32], Literal[32]]
    scale_fmt: Literal["ue8m0"]

    @classmethod
    def release(cls) -> QuantizationConfig:
        return cls(
            quant_method="fp8",
            expert_dtype="fp4",
            activation_scheme="dynamic",
            weight_block_size=(FP8_BLOCK, FP8_BLOCK),
            scale_fmt="ue8m0",
        )

    def to_hf_dict(self) -> dict:
        return self.model_dump(mode="json")
