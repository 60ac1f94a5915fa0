"""Grouped MoE tile options under Triton's CPU interpreter (float32, tiny shapes) against the reference's
routed experts: split_k 2 (the FP4 high nibbles' products in a second accumulator, summed at the end),
a down tile other than the gate+up tile (same block_m), maxnreg (a launch option the interpreter ignores,
so only the plumbing is checked here), E4M3 experts; the FP4 kernels with TMA boxes (TileConfig.tma:
weights alone, + the down kernel's activations in split-order rows (TMA_ACTS), mixed with the pointer
kernels, split_k 2, bitwise the pointer kernels at the same tiles); batch-invariant mode's prefill tiles
(FP4 by TMA and by pointers, E4M3 at each block size, the FP8 shared expert); and the checks on bad tiles."""

import pytest

pytestmark = pytest.mark.slow

_SCRIPT = r"""
import torch
from deepinfer.checkpoint.formats import quantize_fp8
from deepinfer.ops.reference import linear as ref_linear, moe as ref_moe
from deepinfer.testing.moe import toy_experts
from deepinfer_kernels_cuda import linear, moe
from deepinfer_kernels_cuda.configs import TileConfig

torch.manual_seed(0)
e, h, i, k, t = 4, 64, 96, 2, 24  # I 96: 64-row tiles are ragged (masked rows); 48 assignments > decode
w = (*toy_experts(e, i, h), *toy_experts(e, i, h), *toy_experts(e, h, i))
ref = ref_moe.prepare_experts(*w)
x = torch.randn(t, h)
weights = torch.rand(t, k)
ids = torch.stack([torch.randperm(e)[:k] for _ in range(t)]).int()
want = ref_moe.routed_experts(x, weights, ids.long(), ref, 1.0)
one = TileConfig(32, 16, 32, 1, 4, 1)
for fp8 in (False, True):
    ours = moe.prepare_experts(*w, fp8=fp8)
    mlp = moe._Mlp(ours.w1, ours.s1, ours.w3, ours.s3, ours.w2, ours.s2, fp8, 1, True)
    for up, down in ((TileConfig(32, 16, 32, 2, 4, 1), None), (one, TileConfig(64, 16, 64, 2, 4, 1, 128)),
                     (TileConfig(64, 32, 64, 2, 4, 1, 128), TileConfig(16, 32, 32, 1, 4, 1))):
        got = moe._grouped_mlp(x, weights, ids, mlp, e, i, 1.0, up, down_cfg=down)
        err = float((got.reshape(t, k, h).sum(1).double() - want.double()).norm() / want.double().norm())
        assert err < 1e-5, (fp8, up, down, err)
tma = ((TileConfig(32, 16, 64, 1, 4, 2, 0, 1), TileConfig(32, 16, 32, 1, 4, 2, 0, 1)),
       (TileConfig(32, 16, 64, 2, 4, 2, 0, 1), TileConfig(64, 16, 32, 1, 4, 2, 0, 3)),
       (TileConfig(32, 16, 32, 1, 4, 2, 0, 1), TileConfig(32, 16, 64, 2, 4, 2, 0, 3)),
       (TileConfig(32, 32, 32, 1, 4, 2, 0, 1), TileConfig(32, 32, 32, 1, 4, 1)),
       (one, TileConfig(32, 16, 32, 1, 4, 2, 0, 1)))
ours = moe.prepare_experts(*w)
mlp = moe._Mlp(ours.w1, ours.s1, ours.w3, ours.s3, ours.w2, ours.s2, False, 1, True)
for up, down in tma:
    got = moe._grouped_mlp(x, weights, ids, mlp, e, i, 1.0, up, down_cfg=down)
    err = float((got.reshape(t, k, h).sum(1).double() - want.double()).norm() / want.double().norm())
    assert err < 1e-5, (up, down, err)
# same tiles, same products in the same order: bitwise the pointer kernels
pointer = moe._grouped_mlp(x, weights, ids, mlp, e, i, 1.0, TileConfig(32, 16, 64, 1, 4, 2),
                           down_cfg=TileConfig(64, 16, 32, 1, 4, 2))
boxed = moe._grouped_mlp(x, weights, ids, mlp, e, i, 1.0, TileConfig(32, 16, 64, 1, 4, 2, 0, 1),
                         down_cfg=TileConfig(64, 16, 32, 1, 4, 2, 0, 3))
assert torch.equal(pointer, boxed)
# batch-invariant mode's prefill tiles (`moe.invariant_tiles` takes them on CUDA only): FP4 through the TMA
# and the pointer kernels, E4M3 experts and the FP8 shared expert (a one-expert MLP, 32x32 block scales)
e2, h2, i2, t2 = 4, 256, 128, 96  # whole 128 / 256-row tiles; 48 assignments per expert
w2 = (*toy_experts(e2, i2, h2), *toy_experts(e2, i2, h2), *toy_experts(e2, h2, i2))
x2, weights2 = torch.randn(t2, h2), torch.rand(t2, k)
ids2 = torch.stack([torch.randperm(e2)[:k] for _ in range(t2)]).int()
want2 = ref_moe.routed_experts(x2, weights2, ids2.long(), ref_moe.prepare_experts(*w2), 1.0)
for fp8, (up, down) in ((False, moe.INVARIANT_PREFILL), (False, moe._INVARIANT_FP4_POINTERS),
                        *((True, tiles) for tiles in moe.INVARIANT_FP8.values())):
    p2 = moe.prepare_experts(*w2, fp8=fp8)
    mlp2 = moe._Mlp(p2.w1, p2.s1, p2.w3, p2.s3, p2.w2, p2.s2, fp8, 1, True)
    got = moe._grouped_mlp(x2, weights2, ids2, mlp2, e2, i2, 1.0, up, down_cfg=down)
    err = float((got.reshape(t2, k, h2).sum(1).double() - want2.double()).norm() / want2.double().norm())
    assert err < 1e-5, (fp8, up, down, err)
sw = [quantize_fp8(torch.randn(*shape) * 0.1) for shape in ((i2, h2), (i2, h2), (h2, i2))]
shared = [linear.prepare_linear("fp8", *w) for w in sw]
mlp2 = moe._Mlp(*(v for p in shared for v in (p.weight, p.scale)), True, 32, False)
got = moe._grouped_mlp(x2, torch.ones(t2, 1), torch.zeros(t2, 1, dtype=torch.int32), mlp2, 1, i2, 1.0,
                       moe.INVARIANT_FP8[64][0], down_cfg=moe.INVARIANT_FP8[64][1])
refs = [ref_linear.prepare_linear("fp8", *w) for w in sw]
gate, up_ = (ref_linear.linear(x2, r, torch.float32) for r in refs[:2])
want_shared = ref_linear.linear(moe.swiglu(gate, up_, 1.0), refs[2], torch.float32)
assert float((got - want_shared).norm() / want_shared.norm()) < 1e-5
for up, down, message in ((TileConfig(32, 16, 32, 3, 4, 1), None, "split_k must be 1 or 2"),
                          (one, TileConfig(32, 32, 32, 1, 4, 1), "down block_m 32"),
                          (TileConfig(64, 16, 32, 1, 4, 1, 0, 1), None, "block_n must divide"),
                          (one, TileConfig(32, 16, 32, 1, 4, 1, 0, 3), "needs a TMA gate+up tile"),
                          (TileConfig(32, 16, 32, 1, 4, 1, 0, 3), None, "a down-tile bit"),
                          (TileConfig(32, 16, 32, 1, 4, 1, 0, 5), None, "bits 1 and TMA_ACTS")):
    try:
        moe._grouped_mlp(x, weights, ids, mlp, e, i, 1.0, up, down_cfg=down)
        raise AssertionError(f"ran with {up}, {down}")
    except ValueError as err:
        assert message in str(err), err
print("ok")
"""


def test_grouped_tile_options_match_reference_in_the_interpreter(run_in_interpreter):
    run_in_interpreter(_SCRIPT)
