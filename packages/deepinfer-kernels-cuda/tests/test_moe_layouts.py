"""The load-time expert layouts (CPU): split nibbles keep every code, placed where the kernels read it,
and the E4M3 re-encoding keeps every value."""

import torch

from deepinfer.checkpoint.formats import unpack_fp4, unpack_fp4_codes
from deepinfer_kernels_cuda.moe import e2m1_to_e4m3, split_nibbles


def test_split_nibbles_places_columns_j_and_j_plus_16_in_byte_j_of_each_group():
    packed = torch.randint(0, 256, (3, 5, 64), dtype=torch.uint8)  # 3 experts, 5 rows, 128 columns
    codes = unpack_fp4_codes(packed)
    split = split_nibbles(packed, chunk=2)  # chunks: also a partial last one
    got = unpack_fp4_codes(split)  # byte c: (low, high) at columns 2c, 2c + 1
    for byte in range(64):
        group, j = divmod(byte, 16)
        assert torch.equal(got[..., 2 * byte], codes[..., 32 * group + j])
        assert torch.equal(got[..., 2 * byte + 1], codes[..., 32 * group + j + 16])


def test_e2m1_to_e4m3_keeps_every_value():
    packed = torch.arange(256, dtype=torch.uint8).repeat(3, 2, 1)  # every byte: every code pair
    got = e2m1_to_e4m3(packed, chunk=2)
    assert got.dtype == torch.float8_e4m3fn and got.shape == (3, 2, 512)
    want = unpack_fp4(packed)
    assert torch.equal(got.float(), want)
    assert torch.equal(got.float().signbit(), want.signbit())  # -0 stays -0


def test_packed_decode_arithmetic_gives_every_code_times_every_scale():
    """`dequant._E2M1_BF16X2_ASM2`'s integer steps, mirrored on int64 (one BF16x2 word: bytes b0, b1 in
    its halves), times the scale factor it builds, equal E2M1 value * 2^(s - 127) for every byte pair and
    scale byte the decode accepts; the other nibble and the other half never leak in."""
    from deepinfer.checkpoint.formats import E2M1_VALUES
    from deepinfer_kernels_cuda.dequant import ASM_MAX_SCALE

    b = torch.arange(256, dtype=torch.int64)
    b0, b1 = b.repeat_interleave(256), b.repeat(256)
    x01 = b0 | (b1 << 16)  # prmt 0x4140
    lo = ((x01 & 0x000F000F) * 4160) & 0x81C081C0
    hi = ((x01 & 0x00F000F0) * 260) & 0x81C081C0

    def halves(word):  # BF16 bit patterns -> float64 values
        bits = torch.stack([word & 0xFFFF, word >> 16], -1).to(torch.int32)
        return (bits << 16).view(torch.float32).double()

    values = torch.tensor(E2M1_VALUES, dtype=torch.float64)
    for s in (0, 1, 100, 127, ASM_MAX_SCALE):
        factor = halves(torch.tensor([(s + 126) << 7]))[0, 0]  # asm_scale_factor
        assert torch.isfinite(factor)
        for word, shift in ((lo, 0), (hi, 4)):
            codes = torch.stack([(b0 >> shift) & 15, (b1 >> shift) & 15], -1)
            want = values[codes] * 2.0 ** (s - 127)
            assert torch.equal(halves(word) * factor, want), (s, shift)
