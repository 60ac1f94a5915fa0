"""Release codecs against hand-computed bytes (model spec §13.3–13.5)."""

from __future__ import annotations

import math

import pytest
import torch

from deepinfer.checkpoint.formats import (
    dequantize_fp4,
    dequantize_fp8,
    dequantize_fp8_rows,
    e2m1_encode,
    pack_fp4,
    quantize_fp4,
    quantize_fp8,
    quantize_fp8_rows,
    ue8m0_exponent_ceil,
    ue8m0_to_float,
    unpack_fp4,
    unpack_fp4_codes,
)


def _bytes(t: torch.Tensor) -> list[int]:
    return t.contiguous().view(torch.uint8).reshape(-1).tolist()


def test_ue8m0_decode_known_bytes():
    raw = torch.tensor([0, 1, 126, 127, 128, 254, 255], dtype=torch.uint8)
    want = [2.0**-127, 2.0**-126, 0.5, 1.0, 2.0, 2.0**127]
    got = ue8m0_to_float(raw)
    assert got[:6].tolist() == want and math.isnan(got[6])
    assert ue8m0_to_float(raw.view(torch.float8_e8m0fnu))[:6].tolist() == want


def test_ue8m0_exponent_ceil_is_exact():
    x = torch.tensor([1.0, 1.5, 0.5, 448.0, 2.0**-127, 3e-39, 2.0**126 * 1.01, 0.0, -2.0, float("nan")])
    assert ue8m0_exponent_ceil(x).tolist() == [127, 128, 126, 136, 0, 0, 254, 127, 127, 127]
    # one ulp above a power of two rounds up, exactly the power stays
    assert (
        ue8m0_exponent_ceil(torch.tensor([torch.nextafter(torch.tensor(4.0), torch.tensor(5.0))])).item()
        == 130
    )
    assert ue8m0_exponent_ceil(torch.tensor([4.0])).item() == 129


def test_fp8_block_quantise_known_bytes():
    w = torch.zeros(33, 40)
    w[0, 0] = 1.0  # block (0,0): amax 1 -> scale 2^ceil(log2(1/448)) = 2^-8 -> 1.0/2^-8 = 256 = e4m3 0x78
    w[32, 39] = -448.0  # block (1,1): scale 1, -448 = e4m3 0xFE
    w[5, 35] = 3.0  # block (0,1): scale 2^ceil(log2(3/448)) = 2^-7 -> 384 = e4m3 0x7C
    q, s = quantize_fp8(w)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float8_e8m0fnu
    assert tuple(s.shape) == (2, 2)
    assert _bytes(s) == [119, 120, 127, 127]
    assert _bytes(q[0, :1]) == [0x78] and _bytes(q[32, 39:]) == [0xFE] and _bytes(q[5, 35:36]) == [0x7C]
    assert torch.equal(dequantize_fp8(q, s), w)


def test_fp8_round_trip_error_bounded():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(100, 70, generator=g) * 0.05
    q, s = quantize_fp8(w)
    back = dequantize_fp8(q, s)
    scale = ue8m0_to_float(s).repeat_interleave(32, 0)[:100].repeat_interleave(32, 1)[:, :70]
    assert ((back - w).abs() <= scale * 16).all()  # e4m3 step at the top binade is 32 units; half of it
    assert torch.equal(dequantize_fp8(q, s, dtype=torch.bfloat16), back.to(torch.bfloat16))


def test_e2m1_ties_go_to_even_code():
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.2499, 0.7501, 7.0, -0.6, -6.0, 0.0])
    assert e2m1_encode(x).tolist() == [0, 2, 2, 4, 4, 6, 6, 0, 2, 7, 9, 15, 0]


def test_fp4_pack_layout_and_known_bytes():
    row = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, -1, -1.5, -2, -3, -4, -6] * 2)
    packed, scale = quantize_fp4(row[None, :])
    assert packed.dtype == torch.int8 and tuple(packed.shape) == (1, 16)
    assert _bytes(scale) == [127]  # amax 6 -> scale 1
    # even column in the low nibble: (0, 0.5) -> 0x10, (1, 1.5) -> 0x32, ..., (-0.5 -> 9 ... )
    assert _bytes(packed)[:8] == [0x10, 0x32, 0x54, 0x76, 0x90, 0xBA, 0xDC, 0xFE]
    assert torch.equal(unpack_fp4(packed), row[None, :])
    assert unpack_fp4_codes(packed)[0, :4].tolist() == [0, 1, 2, 3]
    assert torch.equal(pack_fp4(unpack_fp4_codes(packed)), packed)


def test_fp4_group_scales_and_round_trip():
    w = torch.zeros(2, 64)
    w[0, :32] = 0.75  # amax 0.75 -> scale 2^ceil(log2(0.125)) = 2^-3 -> 0.75/0.125 = 6 -> code 7
    w[1, 40] = -10.0  # amax 10 -> scale 2^ceil(log2(10/6)) = 2 -> -5 -> tie to code 6 (|4|), negative
    packed, scale = quantize_fp4(w)
    assert _bytes(scale) == [124, 127, 127, 128]
    back = dequantize_fp4(packed, scale)
    assert back[0, :32].eq(0.75).all() and back[1, 40].item() == -8.0
    assert back[1].count_nonzero().item() == 1


def test_engram_rows_per_row_scales():
    w = torch.arange(3 * 64, dtype=torch.float32).reshape(3, 64) / 10
    q, s = quantize_fp8_rows(w)
    assert tuple(q.shape) == (3, 64) and tuple(s.shape) == (3, 2)
    back = dequantize_fp8_rows(q, s)
    assert torch.allclose(back, w, rtol=2**-4)
    # a gathered subset decodes the same as the full table
    idx = torch.tensor([2, 0])
    assert torch.equal(dequantize_fp8_rows(q[idx], s[idx]), back[idx])


@pytest.mark.parametrize("shape", [(1, 32), (31, 33), (64, 96)])
def test_quantisers_accept_ragged_shapes(shape):
    w = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    _, s = quantize_fp8(w)
    assert tuple(s.shape) == (-(-shape[0] // 32), -(-shape[1] // 32))
    if shape[1] % 2 == 0:
        p, s4 = quantize_fp4(w)
        assert tuple(p.shape) == (shape[0], shape[1] // 2) and tuple(s4.shape) == (
            shape[0],
            -(-shape[1] // 32),
        )
