"""Linear layers over release-format weights: dequantise per use (the checkpoint codecs define the
formats), then multiply in the compute dtype."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from deepinfer.checkpoint.formats import dequantize_fp4, dequantize_fp8


def fp8_block_linear(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """y = x W^T with W given as FP8 E4M3 + 32x32 UE8M0 block scales; product in `out_dtype`."""
    return F.linear(x.to(out_dtype), dequantize_fp8(weight, scale, dtype=out_dtype))


def fp4_linear(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """y = x W^T with W given as packed MXFP4 [R, C/2] + [R, C/32] scales; product in `out_dtype`."""
    return F.linear(x.to(out_dtype), dequantize_fp4(weight, scale, dtype=out_dtype))


def dense_linear(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """y = x W^T for an unquantised (BF16/F32) weight, product in `out_dtype`."""
    return F.linear(x.to(out_dtype), weight.to(out_dtype))
