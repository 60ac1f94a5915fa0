"""Batch-invariant linears: with `batch_invariant=True` a row's output is bitwise the same
alone and at any position of batches of 3/17/64/256 rows and one past DEQUANT_M (where the weight is
decoded once before the same kernel), for FP8 (plain and grouped), FP4 and dense weights, and still
matches the reference op. The default mode is shown to need the switch (its GEMV and
tiled paths sum in different orders), so the bitwise checks can fail."""

from dataclasses import replace

import pytest
import torch

from deepinfer.checkpoint.formats import quantize_fp4, quantize_fp8
from deepinfer.ops.reference import linear as ref_linear
from deepinfer_kernels_cuda import configs, linear

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

BATCHES = (3, 17, 64, 256, configs.DEQUANT_M + 88)
# name -> (kind, out rows, in columns per group, groups, out dtype): Flash-like widths, kept small;
# mostly float32 outputs, which show any change of summation order (bf16 rounding hides most)
CASES = {
    "fp8": ("fp8", 1024, 1280, 1, torch.float32),
    "fp8 bf16 out": ("fp8", 512, 5120, 1, torch.bfloat16),
    "fp8 grouped": ("fp8", 8 * 128, 512, 8, torch.float32),
    "fp4": ("fp4", 512, 1024, 1, torch.float32),
    "dense": ("dense", 2048, 1024, 1, torch.float32),
    "dense grouped": ("dense", 4 * 64, 256, 4, torch.float32),
}


def _prepared(kind: str, n: int, k: int, groups: int):
    w = torch.randn(n, k, device="cuda") * 0.05
    weight, scale = {"fp8": quantize_fp8, "fp4": quantize_fp4}.get(kind, lambda t: (t.bfloat16(), None))(w)
    args = (kind, weight, scale, groups)
    return linear.prepare_linear(*args), ref_linear.prepare_linear(*args)


@pytest.mark.parametrize("name", list(CASES))
def test_row_is_bitwise_the_same_alone_and_in_any_batch(name):
    kind, n, k, groups, out_dtype = CASES[name]
    torch.manual_seed(0)
    ours, ref = _prepared(kind, n, k, groups)
    x = torch.randn(max(BATCHES), groups * k, device="cuda", dtype=torch.bfloat16)
    alone = torch.cat([linear.linear(x[i:i + 1], ours, out_dtype, batch_invariant=True) for i in range(3)])
    for b in BATCHES:
        where = [0, b // 2, b - 1]  # the probe rows sit at the start, the middle and the end of the batch
        batch = torch.randn(b, groups * k, device="cuda", dtype=x.dtype)
        batch[where] = x[:3]
        got = linear.linear(batch, ours, out_dtype, batch_invariant=True)
        assert torch.equal(got[where], alone), (name, b)
    want = ref_linear.linear(x, ref, out_dtype)
    got = linear.linear(x, ours, out_dtype, batch_invariant=True)
    tol = 1e-2 if out_dtype == torch.bfloat16 else 1e-5
    assert float((got.double() - want.double()).norm() / want.double().norm()) <= tol


def test_default_mode_is_not_batch_invariant():
    """The check above can fail: by default one row alone takes the GEMV, in a batch the tiled kernel."""
    torch.manual_seed(1)
    ours, _ = _prepared("fp8", 1024, 1280, 1)
    x = torch.randn(64, 1280, device="cuda", dtype=torch.bfloat16)
    one, batch = linear.linear(x[:1], ours, torch.float32), linear.linear(x, ours, torch.float32)
    assert not torch.equal(one, batch[:1])


def test_invariant_mode_ignores_the_m_tuned_table(monkeypatch):
    """Invariant mode must not consult the per-M configs (a table entry for one M would change the order)."""
    from deepinfer_kernels_cuda import configs

    def refuse(*args, **kwargs):
        raise AssertionError("per-M config looked up in batch-invariant mode")

    monkeypatch.setattr(configs, "lookup", refuse)
    ours, _ = _prepared("fp8", 512, 512, 1)
    for m in (1, 4, 600):
        linear.linear(torch.randn(m, 512, device="cuda", dtype=torch.bfloat16), ours, torch.bfloat16,
                      batch_invariant=True)


@pytest.mark.parametrize("kind", ["fp8", "dense"])
def test_invariant_tile_changes_keep_the_bits(kind):
    """Each change of tile `_invariant_tiles` makes with M, one at a time (token tile 16-128, 128-row
    tiles of 8 warps, pipeline stages, K steps of 64 inside the base's, the split summed inside each
    program in one loop over the K steps), and the large tiles it takes, give bitwise the outputs of the
    base config: with the split fixed, the wgmma chain's sums do not depend on the tile. All variants run
    before the assertion, so a failure names every change that broke."""
    torch.manual_seed(2)
    ours, _ = _prepared(kind, 1024, 2048, 1)
    x = torch.randn(200, 2048, device="cuda", dtype=torch.bfloat16)
    base = configs.TileConfig(64, 16, 256 if kind == "fp8" else 128, 4, 4, 4)
    want = linear.tiled_linear(x, ours, torch.float32, base)
    variants = {  # name: (config, split in program, K step)
        "split in program": (base, True, 0),
        "16 -> 32 tokens": (replace(base, block_m=32), False, 0),
        "64 tokens, 3 stages": (replace(base, block_m=64, num_stages=3), False, 0),
        "128 rows, 8 warps, 3 stages": (replace(base, block_n=128, num_warps=8, num_stages=3), False, 0),
        "K step 64": (base, False, 64),
        "K step 64, split in program": (base, True, 64),
        "128 x 64, 8 warps, 2 stages, split in program": (
            replace(base, block_n=128, block_m=64, num_warps=8, num_stages=2), True, 0),
        "128 x 128, 8 warps, 2 stages": (replace(base, block_n=128, block_m=128, num_warps=8, num_stages=2),
                                         False, 0),
    }
    shaped = [tile for _, tile in linear.INVARIANT_SHAPE_TILES]
    for bn, bm, bk, warps, stages in (*linear.INVARIANT_LARGE_TILES, *shaped):
        cfg = replace(base, block_n=bn, block_m=bm, num_warps=warps, num_stages=stages)
        variants[f"large {bn} x {bm} x {bk}, {warps} warps, {stages} stages, split in program"] = (
            cfg, True, bk)
    fits = {name: v for name, v in variants.items()
            if linear._smem_bytes(v[0], ours.weight.element_size(), v[2]) <= linear._SMEM_BUDGET}
    assert len(fits) >= 9, list(fits)
    broke = [name for name, (cfg, loop, bk) in fits.items() if not torch.equal(
        linear.tiled_linear(x, ours, torch.float32, cfg, split_loop=loop, k_step=bk), want)]
    assert not broke, (kind, broke)


def test_invariant_tiles_keep_the_split():
    """`_invariant_tiles` changes no split of the base config at any M (the K steps place its boundaries;
    a K step of its own divides them)."""
    base = configs.default_invariant_linear("fp8", 5120, 8192)
    x = torch.empty(1, 8192, device="cuda", dtype=torch.bfloat16)
    for m in (1, 8, 17, 64, 65, 300, 600, 1024, 4096):
        cfg, _, k_step = linear._invariant_tiles(base, m, 5120, x, k=8192)
        assert (cfg.block_k, cfg.split_k) == (base.block_k, base.split_k), m
        assert base.block_k % (k_step or base.block_k) == 0, m
        # o_b's shape takes K steps of 128 in 3 stages from 1024 tokens (INVARIANT_SHAPE_TILES)
        assert (k_step == 128 and cfg.num_stages == 3) == (m >= 1024), (m, cfg, k_step)
