"""Session 6's garbage rows, on the GPU: the grouped FP4 expert kernels at a 512-token prefill over 64
experts (top-6, Flash widths 5120 / 2304) with the tile the H200 table gives 3072 assignments, packed PTX
decode. At c9f0981 (row-masked weight loads, before EVEN_N) some down-kernel programs wrote |v| > 1e30 into
8-32 of their 128 output columns for every token of their block, other programs in every run (session 7
call B); those rows crashed batch_invariance --cost. Here: every repeat is finite, small, bitwise the
first, and the first 16 tokens match the reference. And the H200 table's own (gate+up, down) tile
pairs at the Flash widths and 384 experts (maxnreg, split_k 2, a down tile of its own) against the fixed
INVARIANT_CONFIG tiles on the same inputs; the TMA kernels (TileConfig.tma) bitwise the pointer kernels at
the same tiles (same products in the same order)."""

import math
from dataclasses import replace

import pytest
import torch

from deepinfer.checkpoint.formats import E2M1_VALUES
from deepinfer.ops.reference import moe as ref_moe
from deepinfer_kernels_cuda import configs, moe

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

E, H, INTER, K, T = 64, 5120, 2304, 6, 512


def _random_fp4(rows: int, cols: int, gen: torch.Generator,
                experts: int = E) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform random packed E2M1 bytes, one power-of-two scale giving unit-variance products."""
    data = torch.randint(0, 256, (experts, rows, cols // 2), dtype=torch.uint8, device="cuda", generator=gen)
    rms = math.sqrt(sum(v * v for v in E2M1_VALUES) / len(E2M1_VALUES))
    byte = 127 + round(math.log2(1 / (rms * math.sqrt(cols))))
    return data, torch.full((experts, rows, cols // 32), byte, dtype=torch.uint8, device="cuda")


def test_grouped_experts_at_the_prefill_tile_are_finite_repeatable_and_right():
    gen = torch.Generator(device="cuda").manual_seed(0)
    release = (*_random_fp4(INTER, H, gen), *_random_fp4(INTER, H, gen), *_random_fp4(H, INTER, gen))
    experts = moe.prepare_experts(*release)
    x = torch.randn(T, H, device="cuda", generator=gen).bfloat16()
    ids = torch.stack([torch.randperm(E, device="cuda", generator=gen)[:K] for _ in range(T)]).int()
    weights = torch.rand(T, K, device="cuda", generator=gen)
    cfg = configs.lookup_moe(T * K, E, H, INTER, x.device)
    first = moe.routed_experts(x, weights, ids, experts, 10.0, cfg)
    assert first.isfinite().all() and float(first.float().abs().max()) < 1e4
    for _ in range(8):
        assert torch.equal(moe.routed_experts(x, weights, ids, experts, 10.0, cfg), first)
    n = 16
    want = ref_moe.routed_experts(x[:n], weights[:n], ids[:n].long(), ref_moe.prepare_experts(*release), 10.0)
    got = first[: n * K].float().unflatten(0, (n, K)).sum(1)
    assert float((got - want.float()).norm() / want.float().norm()) < 1e-2


@pytest.mark.parametrize("tokens", [64, 2048, 4096])
def test_table_tiles_at_flash_widths_match_the_invariant_tiles(tokens):
    n = 384
    gen = torch.Generator(device="cuda").manual_seed(1)
    experts = moe.prepare_experts(*_random_fp4(INTER, H, gen, n), *_random_fp4(INTER, H, gen, n),
                                  *_random_fp4(H, INTER, gen, n))
    x = torch.randn(tokens, H, device="cuda", generator=gen).bfloat16()
    ids = torch.stack([torch.randperm(n, device="cuda", generator=gen)[:K] for _ in range(tokens)]).int()
    weights = torch.rand(tokens, K, device="cuda", generator=gen)
    got = moe.routed_experts(x, weights, ids, experts, 10.0)  # the table's tiles (>= 384 assignments)
    assert got.isfinite().all()
    assert torch.equal(moe.routed_experts(x, weights, ids, experts, 10.0), got)
    want = moe.routed_experts(x, weights, ids, experts, 10.0, moe.INVARIANT_CONFIG).float()
    assert float((got.float() - want).norm() / want.norm()) < 1e-3


@pytest.mark.parametrize("up, down", [
    (configs.TileConfig(128, 64, 128, 1, 8, 3, 128), configs.TileConfig(256, 64, 64, 1, 8, 3)),
    (configs.TileConfig(64, 64, 64, 1, 4, 3, 128), configs.TileConfig(128, 64, 64, 1, 8, 3)),
])
def test_tma_kernels_are_bitwise_the_pointer_kernels_at_the_same_tiles(up, down):
    n, tokens = 384, 1024
    gen = torch.Generator(device="cuda").manual_seed(2)
    experts = moe.prepare_experts(*_random_fp4(INTER, H, gen, n), *_random_fp4(INTER, H, gen, n),
                                  *_random_fp4(H, INTER, gen, n))
    x = torch.randn(tokens, H, device="cuda", generator=gen).bfloat16()
    ids = torch.stack([torch.randperm(n, device="cuda", generator=gen)[:K] for _ in range(tokens)]).int()
    weights = torch.rand(tokens, K, device="cuda", generator=gen)
    want = moe.routed_experts(x, weights, ids, experts, 10.0, up, down)
    assert want.isfinite().all()
    for tma_down in (1, moe.TMA_ACTS | 1):  # the down kernel's activations by pointers, then as boxes
        got = moe.routed_experts(x, weights, ids, experts, 10.0, replace(up, tma=1),
                                 replace(down, tma=tma_down))
        assert torch.equal(got, want), tma_down
