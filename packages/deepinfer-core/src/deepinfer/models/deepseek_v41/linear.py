"""Linear layers that keep their release storage (FP8 blocks, packed FP4, BF16/F32) and dequantise per use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from deepinfer.models.deepseek_v41.weights import WeightError, Weights
from deepinfer.ops import Ops

_E8M0_NAN = 0xFF
BLOCK = 32


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def check_scale(weights: Weights, key: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A UE8M0 scale tensor of `shape` without NaN bytes (0xFF)."""
    s = weights.get(key, shape)
    if s.dtype not in (torch.float8_e8m0fnu, torch.uint8):
        raise WeightError(f"{weights.name(key)}: dtype {s.dtype}, expected F8_E8M0")
    if bool((s.view(torch.uint8) == _E8M0_NAN).any()):
        raise WeightError(f"{weights.name(key)}: NaN scale (byte 0xFF)")
    return s


@dataclass
class Linear:
    """y = x W^T in `dtype`; W stays in its storage form (see NOTES.md)."""

    kind: Literal["fp8", "fp4", "dense"]
    weight: torch.Tensor
    scale: torch.Tensor | None
    ops: Ops
    dtype: torch.dtype

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    @property
    def in_features(self) -> int:
        return self.weight.shape[1] * (2 if self.kind == "fp4" else 1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "fp8":
            return self.ops.fp8_block_linear(x, self.weight, self.scale, self.dtype)
        if self.kind == "fp4":
            return self.ops.fp4_linear(x, self.weight, self.scale, self.dtype)
        return self.ops.dense_linear(x, self.weight, self.dtype)

    def dense(self) -> torch.Tensor:
        eye = torch.eye(self.in_features, dtype=self.dtype, device=self.weight.device)
        return self(eye).T.contiguous()


def make_linear(
    weights: Weights, name: str, ops: Ops, dtype: torch.dtype, shape: tuple[int, int] | None = None
) -> Linear:
    """The linear stored as `<name>.weight` (+ `.scale`), of logical [out, in] `shape` when given."""
    w = weights[f"{name}.weight"]
    if w.ndim != 2:
        raise WeightError(f"{weights.name(name)}.weight: rank {w.ndim}, expected a 2-D matrix")
    if f"{name}.scale" not in weights:
        if w.dtype in (torch.float8_e4m3fn, torch.int8):
            raise WeightError(f"{weights.name(name)}.scale: missing from the checkpoint")
        return Linear("dense", weights.get(f"{name}.weight", shape), None, ops, dtype)
    if w.dtype == torch.float8_e4m3fn:
        rows, cols = shape or tuple(w.shape)
        weights.get(f"{name}.weight", (rows, cols))
        scale = check_scale(weights, f"{name}.scale", (_cdiv(rows, BLOCK), _cdiv(cols, BLOCK)))
        return Linear("fp8", w, scale, ops, dtype)
    if w.dtype in (torch.int8, torch.uint8):
        rows, cols = shape or (w.shape[0], w.shape[1] * 2)
        weights.get(f"{name}.weight", (rows, cols // 2))
        scale = check_scale(weights, f"{name}.scale", (rows, _cdiv(cols, BLOCK)))
        return Linear("fp4", w, scale, ops, dtype)
    raise WeightError(f"{weights.name(name)}.weight: dtype {w.dtype} cannot carry a block scale")
