"""In-register decoding of the release weight formats (checkpoint/formats.py) into float32 tiles.

UE8M0 scales are powers of two, so a decoded FP8 (E4M3) or FP4 (E2M1) value times its scale is exact in
BF16: kernels decode a tile, cast it to the MMA dtype and accumulate in float32, which matches the
reference (dequantise, then multiply) up to summation order. `dequantize` writes a whole decoded weight
(the linears' large-M path multiplies it with cuBLAS).
"""

import torch
import triton
import triton.language as tl

from deepinfer_kernels_cuda import configs
from deepinfer_kernels_cuda.e2m1_asm import e2m1_bf16x2_asm

GROUP = 32  # columns per scale: 32x32 blocks for FP8, 1x32 row groups for FP4
GROUP_TL = tl.constexpr(GROUP)  # the same, readable inside kernels
_DEQUANT_ROWS, _DEQUANT_COLS = 32, 256  # tile of the `dequantize` kernel


@triton.jit
def pow2(s, bias: tl.constexpr):
    """2^(s - 127 + bias) for UE8M0 bytes `s`, built from the float32 exponent field.

    Valid for 1 <= s + bias <= 254; byte 0 with bias 0 would be the subnormal 2^-127, which no
    quantiser writes (it reads as 0 here)."""
    return ((s.to(tl.int32) + bias) << 23).to(tl.float32, bitcast=True)


@triton.jit
def scale_groups(w, s, BN: tl.constexpr, BK: tl.constexpr, G: tl.constexpr):
    """w [BN, BK] times s [BN, BK // G]: one scale per row per run of G columns."""
    if BK == G:
        return w * s
    w3 = tl.reshape(w, (BN, BK // G, G))
    return tl.reshape(w3 * s[:, :, None], (BN, BK))


@triton.jit
def e2m1_times_2pow_m14(packed):
    """Packed FP4 bytes [R, C/2] (even column in the low nibble) -> float32 [R, C] = E2M1 value * 2^-14.

    The 3 magnitude bits go to the top of an fp16's exponent/mantissa field, giving value * 2^-14
    exactly (code 1 = 0.5 lands on the fp16 subnormal 2^-15, which the conversion keeps); callers fold
    the 2^14 back into the scale (`pow2(s, 14)`)."""
    b = packed.to(tl.int16) & 0xFF
    codes = tl.interleave(b & 0xF, b >> 4)
    half_bits = ((codes & 7) << 9) | ((codes & 8) << 12)
    return half_bits.to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _half_bits_to_f32(bits):
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def e2m1_pair_times_2pow_m14(packed):
    """Packed FP4 bytes [R, C/2] -> (low nibbles, high nibbles) as float32 [R, C/2] = E2M1 value * 2^-14.

    The fp16 bit placement of `e2m1_times_2pow_m14` without the interleave (split-layout callers pair the
    halves with the columns `split_columns` names): each value is two shifts and a bit select of the byte."""
    b = packed.to(tl.int32)  # zero-extended
    lo = ((b << 9) & 0x0E00) | ((b << 12) & 0x8000)
    hi = ((b << 5) & 0x0E00) | ((b << 8) & 0x8000)
    return _half_bits_to_f32(lo), _half_bits_to_f32(hi)


@triton.jit
def fp8_tile(w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn,
             BN: tl.constexpr, BK: tl.constexpr, SCALE_ROWS: tl.constexpr):
    """FP8 weight rows offs_n x columns k0..k0+BK (k0 a multiple of BK), one scale per SCALE_ROWS rows
    per 32 columns: 32 for the 32x32-block linears, 1 for experts re-encoded from FP4."""
    offs_k = tl.multiple_of(k0, BK) + tl.arange(0, BK)  # alignment hint for vector loads
    # no `other`: rows past N only feed output rows that are never stored
    wq = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :], mask=n_mask[:, None])
    sk = k0 // GROUP_TL + tl.arange(0, BK // GROUP_TL)
    rows = offs_n // SCALE_ROWS
    s = tl.load(s_ptr + rows[:, None] * stride_sn + sk[None, :], mask=n_mask[:, None], other=127)
    return scale_groups(wq.to(tl.float32), pow2(s, 0), BN, BK, GROUP_TL)


@triton.jit
def fp4_group_tile(w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn,
                   BN: tl.constexpr, BK: tl.constexpr):
    """Packed FP4 weight rows offs_n x columns k0..k0+BK (k0 a multiple of BK) with 1x32 row scales, as
    BF16 (exact), decoded through float32 Triton ops."""
    kb = tl.multiple_of(k0 // 2, BK // 2) + tl.arange(0, BK // 2)  # alignment hint for vector loads
    packed = tl.load(w_ptr + offs_n[:, None] * stride_wn + kb[None, :], mask=n_mask[:, None])
    sk = k0 // GROUP_TL + tl.arange(0, BK // GROUP_TL)
    s = tl.load(s_ptr + offs_n[:, None] * stride_sn + sk[None, :], mask=n_mask[:, None], other=127)
    return scale_groups(e2m1_times_2pow_m14(packed), pow2(s, 14), BN, BK, GROUP_TL).to(tl.bfloat16)  # exact


@triton.jit
def split_columns(k0, BK: tl.constexpr):
    """Input columns of the low and high nibbles of the packed bytes k0/2 .. (k0 + BK)/2 - 1 in the
    split layout (`split_nibbles`): byte j of each 32-column group holds columns j and j + 16."""
    c = tl.arange(0, BK // 2)
    lo = k0 + (c // 16) * 32 + c % 16
    return lo, lo + 16


@triton.jit
def _split_bytes(w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn, BN: tl.constexpr, BK: tl.constexpr):
    """Split-layout FP4 rows offs_n x columns k0..k0+BK as stored: packed bytes [BN, BK/2] and UE8M0
    scale bytes [BN, BK/32]."""
    kb = tl.multiple_of(k0 // 2, BK // 2) + tl.arange(0, BK // 2)  # alignment hint for vector loads
    # no `other`: rows past N only feed output rows that are never stored
    packed = tl.load(w_ptr + offs_n[:, None] * stride_wn + kb[None, :], mask=n_mask[:, None])
    sk = k0 // GROUP_TL + tl.arange(0, BK // GROUP_TL)
    s = tl.load(s_ptr + offs_n[:, None] * stride_sn + sk[None, :], mask=n_mask[:, None], other=127)
    return packed, s


@triton.jit
def _split_tile(w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn, BN: tl.constexpr, BK: tl.constexpr):
    """Split-layout FP4 rows offs_n x columns k0..k0+BK: (low, high) nibble values * 2^-14 as float32
    [BN, BK/2] and the matching scales 2^(s+14) [BN, BK/32] (one per 16 bytes)."""
    packed, s = _split_bytes(w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn, BN, BK)
    lo, hi = e2m1_pair_times_2pow_m14(packed)
    return lo, hi, pow2(s, 14)


# Packed E2M1 -> BF16 decode (e2m1_asm), the factors scale * 2^126 (`asm_scale_factor`). Two bytes per
# instance: the MMA operand layout holds byte pairs, so pairs need no repacking.
_E2M1_BF16X2_ASM2 = tl.constexpr(e2m1_bf16x2_asm(2, times_2pow126=False))

# Four bytes per instance, for layouts holding 4+ contiguous bytes per thread (the GEMVs).
_E2M1_BF16X2_ASM4 = tl.constexpr(e2m1_bf16x2_asm(4, times_2pow126=False))

# largest UE8M0 byte the packed decode takes (its scale factor 2^(s - 1) must stay a finite BF16)
ASM_MAX_SCALE = 128


@triton.jit
def asm_scale_factor(s):
    """UE8M0 bytes s -> 2^(s - 127) * 2^126 as BF16 (bits (s + 126) << 7; s <= ASM_MAX_SCALE)."""
    return ((s.to(tl.int16) + 126) << 7).to(tl.bfloat16, bitcast=True)


@triton.jit
def e2m1_pair_bf16_asm(packed, factor, PACK: tl.constexpr):
    """Packed FP4 bytes (uint8) and their `asm_scale_factor`s (BF16, broadcast to one shape) -> (low
    nibbles, high nibbles) * scale as BF16 (exact), PACK (2 or 4) bytes per asm instance (CUDA only)."""
    if PACK == 2:
        return tl.inline_asm_elementwise(_E2M1_BF16X2_ASM2, "=r,=r,r,r", [packed, factor],
                                         dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=2)
    return tl.inline_asm_elementwise(_E2M1_BF16X2_ASM4, "=r,=r,=r,=r,r,r,r", [packed, factor],
                                     dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)


@triton.jit
def fp4_split_decode(packed, s, BN: tl.constexpr, BK: tl.constexpr, ASM: tl.constexpr = False,
                     PACK: tl.constexpr = 2):
    """Split-layout FP4 bytes [BN, BK/2] and their scale bytes [BN, BK/32] as scaled BF16 (low, high)
    [BN, BK/2] (exact). ASM: the packed decode (`e2m1_pair_bf16_asm`, PACK bytes per instance), else
    Triton integer and float32 ops."""
    if ASM:
        factor = asm_scale_factor(s)[:, :, None]
        lo, hi = e2m1_pair_bf16_asm(tl.reshape(packed, (BN, BK // GROUP_TL, GROUP_TL // 2)), factor, PACK)
        return tl.reshape(lo, (BN, BK // 2)), tl.reshape(hi, (BN, BK // 2))
    lo, hi = e2m1_pair_times_2pow_m14(packed)
    sc = pow2(s, 14)
    return (scale_groups(lo, sc, BN, BK // 2, GROUP_TL // 2).to(tl.bfloat16),
            scale_groups(hi, sc, BN, BK // 2, GROUP_TL // 2).to(tl.bfloat16))


@triton.jit
def fp4_split_tile(w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn,
                   BN: tl.constexpr, BK: tl.constexpr, ASM: tl.constexpr = False):
    """Split-layout FP4 rows offs_n x columns k0..k0+BK as two BF16 tiles [BN, BK/2] (exact): the
    columns `split_columns` names, low nibbles then high (`fp4_split_decode`)."""
    packed, s = _split_bytes(w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn, BN, BK)
    return fp4_split_decode(packed, s, BN, BK, ASM)


@triton.jit
def fp4_gemv_products(acc, w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn, x_lo, x_hi,
                      BN: tl.constexpr, BK: tl.constexpr, ASM: tl.constexpr = False):
    """acc [BN, BK/2] (float32) plus the products of split-layout FP4 rows offs_n x columns k0..k0+BK
    with one input row, given at the low and high nibbles' columns [BK/2]: each entry gains a column
    pair's scaled products. ASM: the packed decode (`e2m1_pair_bf16_asm`), two FMAs per byte."""
    if ASM:
        packed, s = _split_bytes(w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn, BN, BK)
        lo, hi = fp4_split_decode(packed, s, BN, BK, True, 4)
        return acc + lo.to(tl.float32) * x_lo[None, :] + hi.to(tl.float32) * x_hi[None, :]
    lo, hi, sc = _split_tile(w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn, BN, BK)
    return acc + scale_groups(lo * x_lo[None, :] + hi * x_hi[None, :], sc, BN, BK // 2, GROUP_TL // 2)


@triton.jit
def _dequantize_kernel(w_ptr, s_ptr, out_ptr, N, stride_wn, stride_sn, stride_on,
                       FP8: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    offs_n = tl.program_id(0) * BN + tl.arange(0, BN)
    k0 = tl.program_id(1) * BK
    n_mask = offs_n < N
    if FP8:
        w = fp8_tile(w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn, BN, BK, GROUP_TL)
    else:
        w = fp4_group_tile(w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn, BN, BK)
    ptrs = out_ptr + offs_n[:, None] * stride_on + (k0 + tl.arange(0, BK))[None, :]
    tl.store(ptrs, w.to(out_ptr.dtype.element_ty), mask=n_mask[:, None])


def dequantize(kind: str, weight: torch.Tensor, scale: torch.Tensor, n: int, k: int,
               dtype: torch.dtype) -> torch.Tensor:
    """A prepared fp8 ([n, k], 32x32 scales) or packed fp4 ([n, k/2], 1x32 scales) weight as [n, k] in
    `dtype` (exact in BF16 and float32); k a multiple of 32."""
    if kind not in ("fp8", "fp4"):
        raise ValueError(f"dequantize: kind {kind!r}, expected 'fp8' or 'fp4'")
    out = torch.empty((n, k), dtype=dtype, device=weight.device)
    bk = configs.block_k(k, _DEQUANT_COLS)
    grid = (triton.cdiv(n, _DEQUANT_ROWS), k // bk)
    _dequantize_kernel[grid](weight, scale, out, n, weight.stride(0), scale.stride(0), out.stride(0),
                             FP8=kind == "fp8", BN=_DEQUANT_ROWS, BK=bk, num_warps=4)
    return out
