"""Linears over backend-prepared weights: `make_linear` checks a checkpoint linear (FP8 blocks, packed
FP4, BF16/F32) and hands it to the backend's `prepare_linear` once; `Linear` calls `linear` on it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

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


@dataclass(frozen=True)
class Linear:
    """y = x W^T in `dtype` through the backend's `linear` op on the weight it prepared at load.

    `groups > 1`: the rows split into `groups` equal blocks and block g multiplies input chunk g, so
    the input is `groups` times as wide as one block's columns.
    """

    kind: Literal["fp8", "fp4", "dense"]
    prepared: Any  # ops.prepare_linear(kind, release weight, scale, groups)
    out_features: int
    in_features: int
    ops: Ops
    dtype: torch.dtype
    device: torch.device

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.linear(x, self.prepared, self.dtype)

    def dense(self) -> torch.Tensor:
        """The effective [out, in] matrix (block-diagonal when grouped), for tests and inspection."""
        return self(torch.eye(self.in_features, dtype=self.dtype, device=self.device)).T.contiguous()


def make_linear(
    weights: Weights,
    name: str,
    ops: Ops,
    dtype: torch.dtype,
    shape: tuple[int, int] | None = None,
    groups: int = 1,
) -> Linear:
    """The linear stored as `<name>.weight` (+ `.scale`), of stored [out, in] `shape` when given.

    `groups > 1` makes it a grouped projection (see `Linear`); `shape` is still the stored matrix's.
    """
    w = weights[f"{name}.weight"]
    if w.ndim != 2:
        raise WeightError(f"{weights.name(name)}.weight: rank {w.ndim}, expected a 2-D matrix")
    scale = None
    if f"{name}.scale" not in weights:
        if w.dtype in (torch.float8_e4m3fn, torch.int8):
            raise WeightError(f"{weights.name(name)}.scale: missing from the checkpoint")
        kind, w = "dense", weights.get(f"{name}.weight", shape)
    elif w.dtype == torch.float8_e4m3fn:
        rows, cols = shape or tuple(w.shape)
        weights.get(f"{name}.weight", (rows, cols))
        kind, scale = "fp8", check_scale(weights, f"{name}.scale", (_cdiv(rows, BLOCK), _cdiv(cols, BLOCK)))
    elif w.dtype in (torch.int8, torch.uint8):
        rows, cols = shape or (w.shape[0], w.shape[1] * 2)
        weights.get(f"{name}.weight", (rows, cols // 2))
        kind, scale = "fp4", check_scale(weights, f"{name}.scale", (rows, _cdiv(cols, BLOCK)))
    else:
        raise WeightError(f"{weights.name(name)}.weight: dtype {w.dtype} cannot carry a block scale")
    rows = w.shape[0]
    if rows % groups or (kind == "fp8" and groups > 1 and (rows // groups) % BLOCK):
        raise WeightError(
            f"{weights.name(name)}.weight: {rows} rows do not split into {groups} groups"
            + (f" of whole {BLOCK}-row FP8 scale blocks" if kind == "fp8" else "")
        )
    cols = w.shape[1] * (2 if kind == "fp4" else 1)
    prepared = ops.prepare_linear(kind, w, scale, groups)
    return Linear(kind, prepared, rows, cols * groups, ops, dtype, w.device)
