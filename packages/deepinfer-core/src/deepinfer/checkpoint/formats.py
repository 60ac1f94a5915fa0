"""Release tensor codecs (model spec §13.3–13.5), vectorised torch, usable on any device.

* Scales are UE8M0: one byte `b` meaning 2^(b - 127), held as `torch.float8_e8m0fnu` (safetensors
  `F8_E8M0`); decoders also accept the same bytes as uint8. Byte 255 is NaN.
* FP8 weights: `float8_e4m3fn` with one scale per block (32x32 for matrices, 1x32 for Engram rows).
* FP4 weights: E2M1 codes `sign<<3 | idx`, two per byte (even column in the low nibble), held as
  int8 `[R, C/2]`, with one scale per row per 32 columns.

Encoders pick scale = 2^ceil(log2(amax / max_code)) per group, computed exactly from the float32 bits,
so every element fits the code range; an all-zero group gets scale 1.
"""

from __future__ import annotations

from functools import cache

import torch
import torch.nn.functional as F

E4M3_MAX = 448.0
E2M1_MAX = 6.0
FP8_BLOCK = (32, 32)
ENGRAM_ROW_BLOCK = (1, 32)
FP4_GROUP = 32
# E2M1 magnitudes by code index; code 8..15 are the negatives (8 is -0)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
# decision boundaries between neighbouring magnitudes (the code index counts boundaries < |x|); where a
# tie must round up to the even code (0.75, 1.75, 3.5) the boundary is the next float32 below the midpoint
_E2M1_BOUNDARIES = (0.25, 0.7499999403953552, 1.25, 1.7499998807907104, 2.5, 3.4999997615814209, 5.0)


# --- UE8M0 scales


def ue8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    """UE8M0 scale bytes (float8_e8m0fnu or uint8) -> float32 powers of two (byte 255 -> NaN)."""
    if scale.dtype == torch.uint8:
        scale = scale.view(torch.float8_e8m0fnu)
    if scale.dtype != torch.float8_e8m0fnu:
        raise TypeError(f"expected float8_e8m0fnu or uint8 scales, got {scale.dtype}")
    return scale.to(torch.float32)


def ue8m0_exponent_ceil(x: torch.Tensor) -> torch.Tensor:
    """Biased exponent byte of the smallest power of two >= x (x > 0, float32), as uint8 in [0, 254].

    Read off the float32 bits: exponent field, plus one if any mantissa bit is set. Zero, negative
    and NaN inputs give byte 127 (scale 1); results are clamped to the UE8M0 range."""
    x = x.to(torch.float32)
    bits = x.view(torch.int32)
    exp = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    byte = exp + (mant != 0).to(torch.int32)
    # subnormal x = mant * 2^-149: ceil(log2 x) = ceil(log2 mant) - 149, exact since mant < 2^23
    sub = torch.ceil(torch.log2(mant.clamp(min=1).to(torch.float32))).to(torch.int32) - 22
    byte = torch.where(exp == 0, sub, byte)
    byte = torch.where((x > 0) & torch.isfinite(x), byte, torch.full_like(byte, 127))
    return byte.clamp_(0, 254).to(torch.uint8)


def float_to_ue8m0(x: torch.Tensor) -> torch.Tensor:
    """Round positive float32 values up to powers of two and store them as float8_e8m0fnu."""
    return ue8m0_exponent_ceil(x).view(torch.float8_e8m0fnu)


# --- block helpers


def _blocked_amax(w: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """max |w| over each (br, bc) block of a 2-D tensor, ragged edges included -> [ceil(R/br), ceil(C/bc)]."""
    br, bc = block
    rows, cols = w.shape
    pr, pc = -rows % br, -cols % bc
    a = w.abs().to(torch.float32)
    if pr or pc:
        a = torch.nn.functional.pad(a, (0, pc, 0, pr))
    return a.reshape((rows + pr) // br, br, (cols + pc) // bc, bc).amax(dim=(1, 3))


def expand_scales(scale: torch.Tensor, block: tuple[int, int], shape: tuple[int, int]) -> torch.Tensor:
    """Per-block float32 scales -> one scale per element of a [R, C] tensor."""
    s = ue8m0_to_float(scale)
    if block[0] > 1:
        s = s.repeat_interleave(block[0], dim=0)[: shape[0]]
    return s.repeat_interleave(block[1], dim=1)[:, : shape[1]]


def scale_shape(shape: tuple[int, int], block: tuple[int, int]) -> tuple[int, int]:
    return (-(-shape[0] // block[0]), -(-shape[1] // block[1]))


# --- FP8 E4M3


def quantize_fp8(w: torch.Tensor, block: tuple[int, int] = FP8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, C] float -> (float8_e4m3fn [R, C], float8_e8m0fnu scales [ceil(R/br), ceil(C/bc)]).

    Elements are divided by their block's power-of-two scale (exact) and cast with round-to-nearest-even;
    |w / scale| <= 448 by construction of the scale, the clamp only guards against rounding of amax/448."""
    if w.ndim != 2:
        raise ValueError(f"quantize_fp8 expects a 2-D tensor, got shape {tuple(w.shape)}")
    scale = float_to_ue8m0(_blocked_amax(w, block) / E4M3_MAX)
    q = (w.to(torch.float32) / expand_scales(scale, block, w.shape)).clamp_(-E4M3_MAX, E4M3_MAX)
    return q.to(torch.float8_e4m3fn), scale


def dequantize_fp8(
    q: torch.Tensor,
    scale: torch.Tensor,
    block: tuple[int, int] = FP8_BLOCK,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """float8_e4m3fn [R, C] with block scales -> [R, C] in `dtype` (product computed in float32)."""
    return (q.to(torch.float32) * expand_scales(scale, block, q.shape)).to(dtype)


def quantize_fp8_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Engram table rows: FP8 E4M3 with one scale per row per 32 columns."""
    return quantize_fp8(w, ENGRAM_ROW_BLOCK)


def dequantize_fp8_rows(
    q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Engram rows (e.g. a gathered subset `table[idx]`, `scale[idx]`) -> [n, D] in `dtype`."""
    return dequantize_fp8(q, scale, ENGRAM_ROW_BLOCK, dtype)


# --- FP4 E2M1 (MXFP4)


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """Already-scaled values -> E2M1 codes (uint8 0..15): nearest magnitude, ties to the even code,
    clamped to ±6, sign bit set for negative inputs."""
    a = x.abs().to(torch.float32)
    # a sum of elementwise comparisons beats torch.bucketize here, notably on small tensors
    idx = (a > _E2M1_BOUNDARIES[0]).to(torch.uint8)
    for b in _E2M1_BOUNDARIES[1:]:
        idx += a > b  # |x| > 6 counts every boundary: code 7
    return idx | ((x < 0).to(torch.uint8) << 3)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes [R, C] (C even) -> int8 [R, C/2], even column in the low nibble."""
    if codes.shape[-1] % 2:
        raise ValueError("pack_fp4 needs an even number of columns")
    c = codes.to(torch.uint8)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).view(torch.int8)


def unpack_fp4_codes(packed: torch.Tensor) -> torch.Tensor:
    """int8/uint8 [R, C/2] -> E2M1 codes uint8 [R, C]."""
    b = packed.view(torch.uint8)
    return torch.stack((b & 0x0F, b >> 4), dim=-1).flatten(-2)


@cache
def _e2m1_byte_table(device: torch.device) -> torch.Tensor:
    """int64 [256]: the float32 values of a packed byte's (low, high) nibbles, side by side in one word
    (one-word rows gather fastest), built once per device: a host->device copy per call would block."""
    values = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    byte = torch.arange(256)
    pairs = torch.stack((values[byte & 0x0F], values[byte >> 4]), dim=-1)
    return pairs.view(torch.int64).flatten().to(device)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """int8/uint8 [..., C/2] -> unscaled E2M1 values float32 [..., C]."""
    byte = packed.view(torch.uint8)
    pairs = _e2m1_byte_table(packed.device).index_select(0, byte.flatten().int())  # int32: a cheaper cast
    return pairs.view(torch.float32).view(*byte.shape[:-1], 2 * byte.shape[-1])


def quantize_fp4(w: torch.Tensor, group: int = FP4_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, C] float -> (packed int8 [R, C/2], float8_e8m0fnu scales [R, ceil(C/group)])."""
    if w.ndim != 2:
        raise ValueError(f"quantize_fp4 expects a 2-D tensor, got shape {tuple(w.shape)}")
    block = (1, group)
    scale = float_to_ue8m0(_blocked_amax(w, block) / E2M1_MAX)
    codes = e2m1_encode(w.to(torch.float32) / expand_scales(scale, block, w.shape))
    return pack_fp4(codes), scale


def dequantize_fp4(
    packed: torch.Tensor, scale: torch.Tensor, group: int = FP4_GROUP, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Packed int8 [R, C/2] with per-row-per-group scales -> [R, C] in `dtype`."""
    values = unpack_fp4(packed)
    rows, cols = values.shape
    scales = ue8m0_to_float(scale)
    padded = scales.shape[1] * group  # a partial last group is padded, scaled and cut off again
    if not cols <= padded < cols + group:
        raise ValueError(f"dequantize_fp4: {scales.shape[1]} scale groups of {group} for {cols} columns")
    if padded != cols:
        values = F.pad(values, (0, padded - cols))
    return (values.view(rows, -1, group) * scales.unsqueeze(-1)).flatten(1)[:, :cols].to(dtype)
