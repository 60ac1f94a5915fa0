"""`vision_config`: the ViT + aligner settings (model spec §3.3, §12). Mandatory in V4.1 configs."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class VisionConfig(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)

    # read by the official engine: required
    hidden_size: int = Field(gt=0)
    patch_size: int = Field(gt=0)
    downsample_ratio: int = Field(gt=0)
    max_image_tokens: int = Field(gt=0)
    min_pixels: int = Field(gt=0)
    max_wh_ratio: float | None = None
    # tower shape (constants in the official engine; Flash values by default)
    num_hidden_layers: int = Field(default=32, ge=0)  # 0: text-only model without vision weights
    num_attention_heads: int = Field(default=16, gt=0)
    intermediate_size: int = Field(default=2816, gt=0)
    rope_theta: float = Field(default=10000.0, gt=0)

    @model_validator(mode="after")
    def _check(self) -> VisionConfig:
        head_dim, rem = divmod(self.hidden_size, self.num_attention_heads)
        if rem or head_dim % 4:
            raise ValueError(
                "num_attention_heads: must split hidden_size into heads of a width divisible by 4 (2D RoPE)"
            )
        if self.max_wh_ratio is not None and self.max_wh_ratio < 1:
            raise ValueError("max_wh_ratio: must be null or >= 1")
        return self

    def to_hf_dict(self) -> dict:
        return self.model_dump(mode="json", exclude_unset=True)
