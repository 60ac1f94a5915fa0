"""The fused MoE decode path (`moe._decode_fused`: the routing and the FP8 shared expert, as one more
assignment, in the routed gate+up launch; the down projections and the combine in one launch) under
Triton's CPU interpreter (float32, tiny shapes) against the reference op: CUDA-core and MMA tiles, FP4
and E4M3 experts, image rows (bias_vl); batch-invariant mode's fused decode (bitwise its unfused path);
and the router's CUDA-core GEMV for few tokens."""

import pytest

pytestmark = pytest.mark.slow

_SCRIPT = r"""
from dataclasses import replace
import torch
from deepinfer.ops.reference import linear as ref_linear, moe as ref_moe
from deepinfer.testing.moe import toy_moe
from deepinfer_kernels_cuda import linear, moe
from deepinfer_kernels_cuda.configs import TileConfig

torch.manual_seed(0)
def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())

e, h, i, k = 8, 64, 96, 3  # I 96: a 64-row gate+up tile is ragged (masked rows)
layer, common = toy_moe(e, h, i, k)
ref = layer(ref_moe.prepare_experts, ref_linear.prepare_linear)
gemv = (TileConfig(16, 1, 64, 1, 4, 1), TileConfig(8, 1, 32, 1, 4, 1))  # 2 K steps of 32 in the down
mma = (TileConfig(64, 16, 32, 1, 4, 1), TileConfig(16, 16, 32, 1, 4, 1))
# down split_k > 1: a program per slot, the last to arrive combining (bitwise the per-token programs' sum)
split = (TileConfig(32, 16, 32, 1, 4, 1), TileConfig(16, 1, 32, 4, 4, 1))
split_mma = (TileConfig(16, 1, 32, 1, 4, 1), TileConfig(32, 16, 32, 4, 4, 1))
assert moe._fused_decode_tiles(1, layer(moe.prepare_experts, linear.prepare_linear)) is None  # no table
for fp8, t, tiles in ((False, 1, gemv), (False, 3, mma), (True, 3, gemv), (True, 1, mma), (False, 3, split),
                      (True, 2, split_mma)):
    ours = layer(lambda *w: moe.prepare_experts(*w, fp8=fp8), linear.prepare_linear)
    x = torch.randn(t, h)
    mask = torch.rand(t) < 0.5
    moe.DECODE_OVERRIDE, moe.DECODE_DOWN_OVERRIDE = tiles
    assert moe._fused_decode_tiles(t, ours) == tiles
    got = moe.moe(x, ours, mask)
    if tiles[1].split_k > 1:
        moe.DECODE_DOWN_OVERRIDE = replace(tiles[1], split_k=1)
        assert torch.equal(got, moe.moe(x, ours, mask)), tiles
    moe.DECODE_OVERRIDE = moe.DECODE_DOWN_OVERRIDE = None
    assert rel(got, ref_moe.moe(x, ref, mask)) < 1e-5, (fp8, t, tiles)
moe.DECODE_OVERRIDE, moe.DECODE_DOWN_OVERRIDE = replace(mma[0], split_k=2), mma[1]
try:  # the gate+up tile takes no split K
    moe.moe(torch.randn(1, h), layer(moe.prepare_experts, linear.prepare_linear))
    raise AssertionError("a gate+up tile with split_k 2 ran")
except ValueError as err:
    assert "split_k 2" in str(err)
moe.DECODE_OVERRIDE = moe.DECODE_DOWN_OVERRIDE = None
# batch-invariant mode up to DECODE_ASSIGNMENTS: the fused kernels at INVARIANT_CONFIG, bitwise the grouped
# kernels' invariant path (DECODE_DOWN_OVERRIDE False: unfused)
for fp8, t in ((False, 1), (True, 3), (False, 10)):
    ours = layer(lambda *w: moe.prepare_experts(*w, fp8=fp8), linear.prepare_linear)
    x = torch.randn(t, h)
    mask = torch.rand(t) < 0.5
    assert moe._fused_decode_tiles(t, ours, True)[0] == moe.INVARIANT_CONFIG
    got = moe.moe(x, ours, mask, batch_invariant=True)
    moe.DECODE_DOWN_OVERRIDE = False
    assert torch.equal(got, moe.moe(x, ours, mask, batch_invariant=True)), (fp8, t)
    moe.DECODE_DOWN_OVERRIDE = None
    assert rel(got, ref_moe.moe(x, ref, mask)) < 1e-5, ("invariant", fp8, t)
moe.ROUTER_GEMV_TOKENS = 16  # the router's CUDA-core GEMV: BF16 and float32 inputs, ragged token counts
for t, dtype in ((1, torch.bfloat16), (3, torch.float32), (9, torch.bfloat16)):
    x = torch.randn(t, h).to(dtype)
    got = moe.router_logits(x, common["gate"])
    assert torch.allclose(got, x.float() @ common["gate"].float().T, rtol=1e-5, atol=1e-5), (t, dtype)
print("ok")
"""


def test_fused_decode_matches_reference_in_the_interpreter(run_in_interpreter):
    run_in_interpreter(_SCRIPT)
