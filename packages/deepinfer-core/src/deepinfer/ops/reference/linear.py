"""Linear layers over release-format weights: dequantise per use, multiply in the compute dtype.

FP8 weights: E4M3 with one UE8M0 scale per 32x32 block. FP4 (MXFP4) weights: two E2M1 codes per
byte (even column in the low nibble) with one UE8M0 scale per row per 32 columns. Scales arrive as
float8_e8m0fnu (or its raw uint8 bytes); both mean 2^(b - 127).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BLOCK = 32
_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def ue8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    """Power-of-two scales as float32."""
    if scale.dtype == torch.uint8:
        scale = scale.view(torch.float8_e8m0fnu)
    return scale.to(torch.float32)


def dequant_fp8_block(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[R, C] E4M3 with [ceil(R/32), ceil(C/32)] block scales -> dense [R, C] in `dtype`."""
    rows, cols = weight.shape
    s = ue8m0_to_float(scale).repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
    return (weight.to(torch.float32) * s).to(dtype)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """[R, C/2] packed E2M1 bytes -> [R, C] float32 code values (unscaled)."""
    table = torch.tensor(_E2M1_VALUES, dtype=torch.float32, device=packed.device)
    b = packed.view(torch.uint8)
    codes = torch.stack((b & 0x0F, b >> 4), dim=-1).flatten(-2)
    return table[codes.long()]


def dequant_fp4(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[R, C/2] packed E2M1 with [R, C/32] scales -> dense [R, C] in `dtype`."""
    values = unpack_fp4(packed)
    return (values * ue8m0_to_float(scale).repeat_interleave(BLOCK, -1)[..., : values.shape[-1]]).to(dtype)


def fp8_block_linear(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """y = x W^T with W given as FP8 E4M3 + 32x32 UE8M0 block scales; product in `out_dtype`."""
    return F.linear(x.to(out_dtype), dequant_fp8_block(weight, scale, out_dtype))


def fp4_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """y = x W^T with W given as packed MXFP4 [R, C/2] + [R, C/32] scales; product in `out_dtype`."""
    return F.linear(x.to(out_dtype), dequant_fp4(weight, scale, out_dtype))


def dense_linear(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """y = x W^T for an unquantised (BF16/F32) weight, product in `out_dtype`."""
    return F.linear(x.to(out_dtype), weight.to(out_dtype))
