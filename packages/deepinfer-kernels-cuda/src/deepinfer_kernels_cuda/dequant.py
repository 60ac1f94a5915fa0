"""In-register decoding of the release weight formats (checkpoint/formats.py) into float32 tiles.

UE8M0 scales are powers of two, so a decoded FP8 (E4M3) or FP4 (E2M1) value times its scale is exact in
BF16: kernels decode a tile, cast it to the MMA dtype and accumulate in float32, which matches the
reference (dequantise, then multiply) up to summation order.
"""

import os

import triton
import triton.language as tl

GROUP = 32  # columns per scale: 32x32 blocks for FP8, 1x32 row groups for FP4
_G = tl.constexpr(GROUP)  # the same, readable inside kernels
# FP4 decode: plain Triton ops (float32, validated on the H200) by default; DEEPINFER_FP4_DECODE=asm selects
# the inline-PTX BF16x2 decode (~25% fewer instructions per tile, compiled for sm_90 but not yet run on a
# GPU: tests/test_linear_moe_cuda.py::test_fp4_decode_paths_agree checks it). The CPU interpreter
# (TRITON_INTERPRET=1) has no PTX.
FP4_ASM = os.environ.get("TRITON_INTERPRET", "0") == "0" and os.environ.get("DEEPINFER_FP4_DECODE") == "asm"

# Per 32-bit register of 4 packed bytes b0..b3 and BF16 scale pairs (s0,s1), (s2,s3): spread two bytes to
# the low byte of each 16-bit half, move each nibble's sign to bit 15 and its 3 magnitude bits to bits 6..8
# (a BF16 whose exponent field is the E2M1 exponent: value * 2^-126, code 1 the subnormal 2^-127), then
# one BF16x2 FMA by 2^(s-1) (and -0) gives value * 2^(s-127) exactly; BF16 arithmetic keeps subnormals.
_E2M1_BF16_PTX = tl.constexpr("""
{
.reg .b32 x, m, g, l, h, z, nz;
mov.b32 z, 0;
mov.b32 nz, 0x80008000;
prmt.b32 x, $4, z, 0x4140;
shl.b32 m, x, 6;  and.b32 m, m, 0x01C001C0;  shl.b32 g, x, 12;  and.b32 g, g, 0x80008000;  or.b32 l, m, g;
shl.b32 m, x, 2;  and.b32 m, m, 0x01C001C0;  shl.b32 g, x, 8;   and.b32 g, g, 0x80008000;  or.b32 h, m, g;
fma.rn.bf16x2 $0, l, $5, nz;
fma.rn.bf16x2 $2, h, $5, nz;
prmt.b32 x, $4, z, 0x4342;
shl.b32 m, x, 6;  and.b32 m, m, 0x01C001C0;  shl.b32 g, x, 12;  and.b32 g, g, 0x80008000;  or.b32 l, m, g;
shl.b32 m, x, 2;  and.b32 m, m, 0x01C001C0;  shl.b32 g, x, 8;   and.b32 g, g, 0x80008000;  or.b32 h, m, g;
fma.rn.bf16x2 $1, l, $6, nz;
fma.rn.bf16x2 $3, h, $6, nz;
}
""")


@triton.jit
def pow2(s, bias: tl.constexpr):
    """2^(s - 127 + bias) for UE8M0 bytes `s`, built from the float32 exponent field.

    Valid for 1 <= s + bias <= 254; byte 0 with bias 0 would be the subnormal 2^-127, which no
    quantiser writes (it reads as 0 here)."""
    return ((s.to(tl.int32) + bias) << 23).to(tl.float32, bitcast=True)


@triton.jit
def scale_groups(w, s, BN: tl.constexpr, BK: tl.constexpr):
    """w [BN, BK] times s [BN, BK // 32]: one scale per row per run of 32 columns."""
    if BK == _G:
        return w * s
    w3 = tl.reshape(w, (BN, BK // _G, _G))
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
def fp8_block_tile(w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn,
                   BN: tl.constexpr, BK: tl.constexpr):
    """FP8 weight rows offs_n x columns k0..k0+BK (k0 a multiple of BK) with 32x32 block scales."""
    offs_k = tl.multiple_of(k0, BK) + tl.arange(0, BK)  # alignment hint for vector loads
    # no `other`: rows past N only feed output rows that are never stored
    wq = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :], mask=n_mask[:, None])
    sk = k0 // _G + tl.arange(0, BK // _G)
    s = tl.load(s_ptr + (offs_n // _G)[:, None] * stride_sn + sk[None, :], mask=n_mask[:, None], other=127)
    return scale_groups(wq.to(tl.float32), pow2(s, 0), BN, BK)


@triton.jit
def e2m1_bf16_asm(packed, s, BN: tl.constexpr, BK: tl.constexpr):
    """Packed FP4 bytes [BN, BK/2] and UE8M0 bytes [BN, BK/32] -> BF16 [BN, BK] = value * 2^(s-127)."""
    scale = ((s.to(tl.int16) - 1) << 7).to(tl.bfloat16, bitcast=True)  # 2^(s-1), exact for s >= 2
    scale = tl.reshape(tl.broadcast_to(scale[:, :, None], (BN, BK // _G, _G // 2)), (BN, BK // 2))
    lo, hi = tl.inline_asm_elementwise(
        _E2M1_BF16_PTX, "=r,=r,=r,=r,r,r,r", [packed, scale],
        dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4,
    )
    return tl.interleave(lo, hi)


@triton.jit
def fp4_group_tile(w_ptr, s_ptr, offs_n, k0, n_mask, stride_wn, stride_sn,
                   BN: tl.constexpr, BK: tl.constexpr, ASM: tl.constexpr):
    """Packed FP4 weight rows offs_n x columns k0..k0+BK (k0 a multiple of BK) with 1x32 row scales, as
    BF16 (exact): through inline PTX when ASM, else through Triton ops in float32."""
    kb = tl.multiple_of(k0 // 2, BK // 2) + tl.arange(0, BK // 2)  # alignment hint for vector loads
    packed = tl.load(w_ptr + offs_n[:, None] * stride_wn + kb[None, :], mask=n_mask[:, None])
    sk = k0 // _G + tl.arange(0, BK // _G)
    s = tl.load(s_ptr + offs_n[:, None] * stride_sn + sk[None, :], mask=n_mask[:, None], other=127)
    if ASM:
        w = e2m1_bf16_asm(packed, s, BN, BK)
    else:
        w = scale_groups(e2m1_times_2pow_m14(packed), pow2(s, 14), BN, BK).to(tl.bfloat16)  # exact
    return w
