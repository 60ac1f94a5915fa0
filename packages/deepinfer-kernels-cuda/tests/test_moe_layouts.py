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
