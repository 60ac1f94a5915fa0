"""Linear layers over release-format weights: the reference keeps the checkpoint storage (FP8 blocks,
packed FP4, BF16/F32) as its prepared form and dequantises per use, then multiplies in the compute dtype."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from deepinfer.checkpoint.formats import FP8_BLOCK, dequantize_fp4, dequantize_fp8

LinearKind = Literal["fp8", "fp4", "dense"]


@dataclass(frozen=True)
class ReferenceLinear:
    """A prepared linear of the reference backend: the release tensors, unchanged."""

    kind: LinearKind
    weight: torch.Tensor  # fp8 [R, C] E4M3 · fp4 [R, C/2] packed E2M1 · dense [R, C]
    scale: torch.Tensor | None  # fp8 [ceil(R/32), ceil(C/32)] · fp4 [R, C/32] UE8M0 · dense None
    groups: int

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        if self.kind == "fp8":
            return dequantize_fp8(self.weight, self.scale, dtype=dtype)
        if self.kind == "fp4":
            return dequantize_fp4(self.weight, self.scale, dtype=dtype)
        return self.weight.to(dtype)


def prepare_linear(
    kind: LinearKind,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    groups: int = 1,
    operand_dtype: torch.dtype | None = None,
) -> ReferenceLinear:
    """Checkpoint tensors of one linear -> its prepared form. `groups > 1`: the rows split into `groups`
    equal blocks and block g multiplies input chunk g (the grouped o-projection). `operand_dtype`: the
    dtype of the inputs it will multiply, which a backend may store a wider dense weight in; the
    reference keeps the checkpoint's storage (F32 heads multiply in F32, as NeMo's)."""
    if kind not in ("fp8", "fp4", "dense"):
        raise ValueError(f"prepare_linear: kind {kind!r}, expected 'fp8', 'fp4' or 'dense'")
    if weight.ndim != 2:
        raise ValueError(f"prepare_linear: weight of shape {tuple(weight.shape)}, expected 2-D")
    if (scale is None) != (kind == "dense"):
        raise ValueError(f"prepare_linear: a {kind} linear {'needs' if scale is None else 'takes no'} scale")
    rows = weight.shape[0]
    if groups < 1 or rows % groups:
        raise ValueError(f"prepare_linear: {rows} rows do not split into {groups} groups")
    if kind == "fp8" and groups > 1 and (rows // groups) % FP8_BLOCK[0]:
        raise ValueError(
            f"prepare_linear: grouped FP8 needs whole {FP8_BLOCK[0]}-row scale blocks per group, "
            f"got {rows // groups} rows"
        )
    return ReferenceLinear(kind, weight, scale, groups)


def linear(x: torch.Tensor, prepared: ReferenceLinear, out_dtype: torch.dtype) -> torch.Tensor:
    """y = x.to(out_dtype) @ W^T with W dequantised to `out_dtype`.

    Grouped: y[:, row block g] = x[:, input chunk g] @ W_g^T (one product per group, as separate linears).
    """
    w = prepared.dequantized(out_dtype)
    x = x.to(out_dtype)
    if prepared.groups == 1:
        return F.linear(x, w)
    pairs = zip(x.chunk(prepared.groups, dim=-1), w.chunk(prepared.groups), strict=True)
    return torch.cat([F.linear(xg, wg) for xg, wg in pairs], dim=-1)
