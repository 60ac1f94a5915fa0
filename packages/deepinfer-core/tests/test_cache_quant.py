"""Release cache quantisers (model spec §6.9) on known values, and the byte layout of cache entries."""

from __future__ import annotations

import pytest
import torch

from deepinfer.cache import Codec, KVCache, cache_layout
from deepinfer.config import ModelConfig
from deepinfer.ops import get_ops
from deepinfer.testing.flash import flash_config_dict

ops = get_ops("reference")


def _round_trip(fmt: str, x: torch.Tensor) -> torch.Tensor:
    codec = Codec(fmt, x.shape[-1], torch.float32)
    return codec.decode(codec.encode(x, ops), ops)


def test_e2m1_ties_go_to_the_even_code() -> None:
    # amax 6 -> MXFP4 scale exactly 1, so the inputs are already in code units
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    expect = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    above = [0.26, 0.76, 1.26, 1.76, 2.51, 3.51, 5.01]
    expect_above = [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    vals = [6.0, *ties, *[-t for t in ties], *above, 0.0, 0.1, -0.1]
    x = torch.tensor(vals + [0.0] * (32 - len(vals)))
    y = _round_trip("mxfp4", x.unsqueeze(0))[0]
    assert y[0] == 6.0
    assert y[1:8].tolist() == expect
    assert y[8:15].tolist() == [-e for e in expect]
    assert y[15:22].tolist() == expect_above
    assert y[22:25].tolist() == [0.0, 0.0, -0.0]


@pytest.mark.parametrize(
    ("amax", "byte"),
    [(448.0, 127), (449.0, 128), (224.0, 126), (1.0, 127 - 8), (0.0, 127 - 22)],  # 1e-4/448 -> 2^-22
)
def test_fp8_window_scale_is_pow2_ceiling(amax: float, byte: int) -> None:
    x = torch.zeros(1, 32)
    x[0, 3] = amax
    data, exp = ops.fp8_quantize(x)
    assert exp.tolist() == [[byte]]
    # 449 / 2 = 224.5 rounds to E4M3 224 (spacing 16 there)
    assert _round_trip("fp8", x)[0, 3] == (448.0 if amax == 449.0 else amax)
    assert data.float()[0, 3] * 2.0 ** (byte - 127) == (448.0 if amax == 449.0 else amax)


@pytest.mark.parametrize(
    ("amax", "scale"),
    # past 6 * 448 the scale saturates at the E4M3 maximum and the element at 6 * 448
    [(6.0, 1.0), (6.6, 1.125), (3.0, 0.5), (0.0, 2.0**-9), (2700.0, 448.0), (1e6, 448.0)],
)
def test_nvfp4_scale_is_e4m3_of_amax_over_6(amax: float, scale: float) -> None:
    x = torch.zeros(1, 16)
    x[0, 0] = amax
    _, s = ops.nvfp4_quantize(x)
    assert s.float().tolist() == [[scale]]
    y = _round_trip("nvfp4", x)
    assert y[0, 0] == (6.0 * scale if amax else 0.0)  # 6.6 / 1.125 = 5.87 -> code 6


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_nvfp4_encodes_the_same_bytes_on_cpu_and_cuda() -> None:
    # amax at 6x every E4M3 rounding midpoint and its float32 neighbours (where a multiplication by a
    # rounded 1/6 can pick the other E4M3 neighbour), plus amax past the E4M3 range
    e4m3 = torch.arange(0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    at = (e4m3[:-1] + e4m3[1:]) / 2 * 6
    out_of_range = torch.tensor([2700.0, 1e6])
    amax = torch.cat((at, torch.nextafter(at, at * 2), torch.nextafter(at, at * 0), out_of_range))
    x = torch.zeros(amax.shape[0], 16)
    x[:, 0], x[:, 1] = amax, -amax / 7
    cpu, cuda = ops.nvfp4_quantize(x), ops.nvfp4_quantize(x.cuda())
    for a, b in zip(cpu, cuda, strict=True):
        assert torch.equal(a.view(torch.uint8), b.cpu().view(torch.uint8))


@pytest.mark.parametrize(("amax", "byte"), [(6.0, 127), (6.1, 128), (3.0, 126), (0.0, 1)])
def test_mxfp4_scale_is_pow2_ceiling(amax: float, byte: int) -> None:
    x = torch.zeros(1, 32)
    x[0, 0] = amax
    _, exp = ops.mxfp4_quantize(x)
    assert exp.tolist() == [[byte]]


def test_entry_bytes_and_flash_sizes() -> None:
    assert Codec("fp8", 512, torch.bfloat16).nbytes == 528
    assert Codec("nvfp4", 512, torch.bfloat16).nbytes == 288
    assert Codec("mxfp4", 128, torch.bfloat16).nbytes == 68
    cfg = ModelConfig.from_hf_dict(flash_config_dict()).text
    layout = cache_layout(cfg, "release", torch.bfloat16, max_backtrack=6)
    assert layout.bytes_per_block == 890 * 128  # spec §15.3
    assert layout.bytes_per_slot == 3_042_336 + 86_016


def test_pool_round_trip_matches_codec() -> None:
    from deepinfer.testing.configs import tiny_config

    cfg = tiny_config("c2").text
    cache = KVCache(cfg, num_blocks=3, num_slots=2, precision="release", dtype=torch.float32, max_backtrack=2)
    kv = cache.compressed_kv(1)  # 64 entries per block
    x = torch.randn(70, cfg.head_dim)
    entries, table = torch.arange(70), torch.tensor([2, 1])  # entries 0..63 in block 2, 64..69 in block 1
    ops.cache_write(kv.data, table[entries // 64] * 64 + entries % 64, x, kv.codec)
    stored = kv.data[table[entries // 64], entries % 64]
    assert torch.equal(kv.codec.decode(stored, ops), _round_trip("nvfp4", x))
    assert cache.blocks[0].count_nonzero() == 0  # padding block untouched


def test_tiny_layout_owners_and_reset_slot() -> None:
    from deepinfer.testing.configs import tiny_config

    cfg = tiny_config("full").text  # KV sources 2 (ratio 2) and 5 (ratio 1); 12 layers + 3 DSpark rings
    spec = KVCache(cfg, 2, 3, "exact", torch.float32, max_backtrack=3).spec
    assert sorted(spec.block_regions) == [("index", 2), ("index", 5), ("kv", 2), ("kv", 5)]
    assert spec.block_regions[("kv", 2)].entries == 64 and spec.block_regions[("kv", 5)].entries == 128
    windows = [k for k in spec.slot_regions if k[0] == "window"]
    assert len(windows) == 15 and spec.slot_regions[("window", 0)].entries == cfg.sliding_window + 3
    assert spec.slot_regions[("compressor", 2)].entries == 2 - 1 + 3  # ratio - 1 + max_backtrack
    assert ("compressor", 5) not in spec.slot_regions  # ratio 1 keeps no partial group
    cache = KVCache(cfg, 2, 3, "release", torch.float32, max_backtrack=3)
    cache.slots[1:] = 7
    cache.reset_slot(2)
    assert cache.slots[2].count_nonzero() == 0 and bool((cache.slots[1] == 7).all())
