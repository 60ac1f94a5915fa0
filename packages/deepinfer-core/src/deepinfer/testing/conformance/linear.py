"""Conformance cases of `linear` over weights each backend prepares itself (`prepare_linear`): FP8
blocks, packed FP4 and dense weights, grouped projections, and M in {1, 7, 300} rows."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from deepinfer.checkpoint.formats import dequantize_fp4, dequantize_fp8, quantize_fp4, quantize_fp8
from deepinfer.testing.conformance import Args, Case, rand, register


def _inputs(kind: str, rows: int, out: int, cols: int, groups: int, x_dtype: torch.dtype,
            out_dtype: torch.dtype):
    """x [rows, groups * cols]; the raw weight [out, cols] (out rows split into `groups` blocks)."""

    def make(device: torch.device, g: torch.Generator) -> Args:
        w = torch.randn(out, cols, generator=g) * cols**-0.5
        if kind == "fp8":
            weight, scale = quantize_fp8(w)
        elif kind == "fp4":
            weight, scale = quantize_fp4(w)
        else:
            weight, scale = w.bfloat16(), None
        x = rand(g, rows, groups * cols, device=device, dtype=x_dtype)
        raw = (kind, weight.to(device), None if scale is None else scale.to(device), groups)
        return (x, raw, out_dtype), {}

    return make


def _prepare(ops: Mapping[str, Callable], args: tuple, kwargs: dict) -> Args:
    x, raw, out_dtype = args
    return (x, ops["prepare_linear"](*raw), out_dtype), kwargs


def _oracle(out: torch.Tensor, args: tuple, kwargs: dict) -> None:
    """Float64 product per group with the weight decoded by the checkpoint codecs."""
    x, prepared, out_dtype = args
    kind, weight, scale, groups = prepared.kind, prepared.weight, prepared.scale, prepared.groups
    if kind == "fp8":
        w = dequantize_fp8(weight, scale, dtype=torch.float64)
    elif kind == "fp4":
        w = dequantize_fp4(weight, scale, dtype=torch.float64)
    else:
        w = weight.double()
    xs, ws = x.to(out_dtype).double().chunk(groups, dim=-1), w.chunk(groups)
    want = torch.cat([xg @ wg.T for xg, wg in zip(xs, ws, strict=True)], dim=-1)
    assert out.shape == want.shape and out.dtype == out_dtype
    tol = 3e-2 if out_dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(out.double(), want, atol=tol, rtol=tol)


for _kind in ("fp8", "fp4", "dense"):
    for _m in (1, 7, 300):
        register(Case("linear", f"{_kind}-m{_m}", _inputs(_kind, _m, 96, 64, 1, torch.float32, torch.float32),
                      _oracle, prepare=_prepare))
    register(Case("linear", f"{_kind}-bf16-m7", _inputs(_kind, 7, 96, 64, 1, torch.bfloat16, torch.bfloat16),
                  _oracle, prepare=_prepare))
# the o-projection's shape: 8 groups of 32 rows (whole FP8 scale blocks), each on its own input chunk
for _m in (1, 7, 300):
    _make = _inputs("fp8", _m, 256, 48, 8, torch.bfloat16, torch.bfloat16)
    register(Case("linear", f"fp8-grouped-m{_m}", _make, _oracle, prepare=_prepare))
# the LM head: dense BF16 weight, float32 logits from a BF16 input
register(Case("linear", "head-f32", _inputs("dense", 5, 300, 64, 1, torch.bfloat16, torch.float32), _oracle,
              prepare=_prepare))
