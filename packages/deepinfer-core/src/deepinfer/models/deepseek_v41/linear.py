"""Linears over backend-prepared weights: `make_linear` checks a checkpoint linear (FP8 blocks, packed
FP4, BF16/F32) and hands it to the backend's `prepare_linear` once; `Linear` calls `linear` on it.
`make_fused_linear` stacks the linears that read one input into one prepared weight (one launch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from deepinfer.models.deepseek_v41.weights import WeightError, Weights
from deepinfer.ops import Ops

_E8M0_NAN = 0xFF
BLOCK = 32
Kind = Literal["fp8", "fp4", "dense"]
Stored = tuple[Kind, torch.Tensor, torch.Tensor | None]  # (kind, weight, scale) as in the checkpoint


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

    kind: Kind
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


def _stored(weights: Weights, name: str, shape: tuple[int, int] | None) -> Stored:
    """(kind, weight, scale) of `<name>.weight` (+ `.scale`) as stored, checked against `shape`."""
    w = weights[f"{name}.weight"]
    if w.ndim != 2:
        raise WeightError(f"{weights.name(name)}.weight: rank {w.ndim}, expected a 2-D matrix")
    if f"{name}.scale" not in weights:
        if w.dtype in (torch.float8_e4m3fn, torch.int8):
            raise WeightError(f"{weights.name(name)}.scale: missing from the checkpoint")
        return "dense", weights.get(f"{name}.weight", shape), None
    if w.dtype == torch.float8_e4m3fn:
        rows, cols = shape or tuple(w.shape)
        weights.get(f"{name}.weight", (rows, cols))
        return "fp8", w, check_scale(weights, f"{name}.scale", (_cdiv(rows, BLOCK), _cdiv(cols, BLOCK)))
    if w.dtype in (torch.int8, torch.uint8):
        rows, cols = shape or (w.shape[0], w.shape[1] * 2)
        weights.get(f"{name}.weight", (rows, cols // 2))
        return "fp4", w, check_scale(weights, f"{name}.scale", (rows, _cdiv(cols, BLOCK)))
    raise WeightError(f"{weights.name(name)}.weight: dtype {w.dtype} cannot carry a block scale")


def _prepared(
    kind: Kind, w: torch.Tensor, scale: torch.Tensor | None, groups: int, ops: Ops, dtype: torch.dtype,
    operand_dtype: torch.dtype | None,
) -> Linear:
    cols = w.shape[1] * (2 if kind == "fp4" else 1)
    prepared = ops.prepare_linear(kind, w, scale, groups, operand_dtype=operand_dtype or dtype)
    return Linear(kind, prepared, w.shape[0], cols * groups, ops, dtype, w.device)


def make_linear(
    weights: Weights,
    name: str,
    ops: Ops,
    dtype: torch.dtype,
    shape: tuple[int, int] | None = None,
    groups: int = 1,
    operand_dtype: torch.dtype | None = None,
) -> Linear:
    """The linear stored as `<name>.weight` (+ `.scale`), of stored [out, in] `shape` when given.

    `groups > 1` makes it a grouped projection (see `Linear`); `shape` is still the stored matrix's.
    `operand_dtype`: the dtype of its inputs when not `dtype` (float32 outputs of model-dtype inputs);
    the backend may store a float32 dense weight in it (`prepare_linear`).
    """
    kind, w, scale = _stored(weights, name, shape)
    rows = w.shape[0]
    if rows % groups or (kind == "fp8" and groups > 1 and (rows // groups) % BLOCK):
        raise WeightError(
            f"{weights.name(name)}.weight: {rows} rows do not split into {groups} groups"
            + (f" of whole {BLOCK}-row FP8 scale blocks" if kind == "fp8" else "")
        )
    return _prepared(kind, w, scale, groups, ops, dtype, operand_dtype)


@dataclass(frozen=True)
class FusedLinear:
    """Linears of one input stacked into one weight at load, so one launch computes them all (at decode
    the small projections are launch-bound); the outputs are column views of the stacked result.

    `parts`: each linear alone, over row slices of the stacked storage (no second copy), for callers
    that need only one of them (empty if not asked for); where the linears cannot stack
    (`make_fused_linear`), `fused` is None and the parts run one by one."""

    sizes: tuple[int, ...]  # out_features of each part
    parts: tuple[Linear, ...]
    fused: Linear | None

    def stacked(self, x: torch.Tensor) -> torch.Tensor:
        """[..., sum of the parts' out_features]: the outputs side by side."""
        if self.fused is None:
            return torch.cat([p(x) for p in self.parts], dim=-1)
        return self.fused(x)

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.fused is None:
            return tuple(p(x) for p in self.parts)
        return self.fused(x).split(self.sizes, dim=-1)


def _stackable(stored: list[Stored]) -> bool:
    """Same kind and storage dtypes, same input width; FP8 scale blocks (32 rows) must not straddle two
    parts, so every part but the last has whole blocks."""
    kind, w0, s0 = stored[0]
    same = all(k == kind and w.dtype == w0.dtype and w.shape[1] == w0.shape[1]
               and (s is None or s.dtype == s0.dtype) for k, w, s in stored)
    return same and (kind != "fp8" or all(w.shape[0] % BLOCK == 0 for _, w, _ in stored[:-1]))


def make_fused_linear(
    weights: Weights,
    linears: list[tuple[str, tuple[int, int]]],
    ops: Ops,
    dtype: torch.dtype,
    operand_dtype: torch.dtype | None = None,
    with_parts: bool = True,
) -> FusedLinear:
    """The linears (name, stored [out, in] shape) that read one input, stacked by rows into one prepared
    weight; the checkpoint's separate tensors are dropped from a mutable mapping (`Weights.release`).
    `with_parts=False`: no per-part linears (a backend that converts the weight at prepare would hold
    each part twice)."""
    stored = [_stored(weights, name, shape) for name, shape in linears]
    sizes = tuple(w.shape[0] for _, w, _ in stored)
    if not _stackable(stored):  # e.g. tiny test configs with partial FP8 blocks
        return FusedLinear(sizes, tuple(_prepared(*st, 1, ops, dtype, operand_dtype) for st in stored), None)
    kind = stored[0][0]
    if len(stored) == 1:  # nothing to stack: the checkpoint's tensors as they are
        _, weight, scale = stored[0]
    else:
        weight = torch.cat([w for _, w, _ in stored])
        scale = None if kind == "dense" else torch.cat([s for _, _, s in stored])
    weights.release([f"{name}.{part}" for name, _ in linears for part in ("weight", "scale")
                     if f"{name}.{part}" in weights])
    fused = _prepared(kind, weight, scale, 1, ops, dtype, operand_dtype)
    parts = []
    if with_parts:
        start = 0
        for _, w, _ in stored:
            end = start + w.shape[0]
            rows = slice(start // BLOCK, _cdiv(end, BLOCK)) if kind == "fp8" else slice(start, end)
            part_scale = None if scale is None else scale[rows]
            parts.append(_prepared(kind, weight[start:end], part_scale, 1, ops, dtype, operand_dtype))
            start = end
    return FusedLinear(sizes, tuple(parts), fused)
