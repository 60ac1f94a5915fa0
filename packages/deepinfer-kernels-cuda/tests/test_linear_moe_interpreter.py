"""The linear and MoE kernels under Triton's CPU interpreter (float32, tiny shapes) against the reference
ops: kernel logic (indexing, masks, split-K, groups, FP4/FP8 decode, routing, alignment) checked without a
GPU. The interpreter must be switched on before triton is imported, hence a subprocess."""

import pytest

pytestmark = pytest.mark.slow

_SCRIPT = r"""
import torch
from deepinfer.checkpoint.formats import quantize_fp4, quantize_fp8
from deepinfer.ops.reference import linear as ref_linear, moe as ref_moe
from deepinfer.testing.moe import toy_moe
from deepinfer_kernels_cuda import configs, linear, moe
from deepinfer_kernels_cuda.configs import TileConfig

torch.manual_seed(0)
def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())

def check(got, want, *what):
    assert rel(got, want) < 1e-5, (*what, rel(got, want))

configs.DEQUANT_M = 16  # M=17: invariant mode's decode-once twin of the tiled kernel
cases = {  # kind -> (M, groups, config, kernel): the FP8 GEMV (num_stages 2: one step prefetched) at any
    # M, the tiled kernel; linear() at its default path too
    "fp8": ((1, 2, TileConfig(8, 1, 32, 1, 4, 1), "gemv"), (1, 1, TileConfig(4, 1, 32, 2, 4, 2), "gemv"),
            (3, 2, TileConfig(16, 4, 64, 1, 1, 2), "gemv"), (3, 1, TileConfig(32, 16, 64, 2, 4, 1), "tiled"),
            # GEMV: 1- and 2-row programs, a step wider than K (masked chunks), prefetch over a ragged
            # last step, 3 splits of one 32-column step each
            (1, 1, TileConfig(1, 1, 128, 1, 4, 1), "gemv"), (2, 2, TileConfig(2, 2, 64, 1, 4, 2), "gemv"),
            (1, 1, TileConfig(1, 1, 32, 3, 4, 2), "gemv"), (8, 1, TileConfig(2, 8, 128, 1, 4, 2), "block"),
            (17, 2, TileConfig(32, 16, 32, 1, 4, 1), "tiled")),
    "fp4": ((1, 2, TileConfig(16, 16, 32, 2, 4, 1), "tiled"),
            (17, 2, TileConfig(32, 16, 32, 1, 4, 1), "tiled")),
}
for kind, quant in (("fp8", quantize_fp8), ("fp4", quantize_fp4)):
    for m, groups, cfg, kernel in cases[kind]:
        w, s = quant(torch.randn(64, 96) * 0.1)  # 96 columns: a ragged last GEMV step at 64 per step
        x = torch.randn(m, 96 * groups)
        ours, ref = linear.prepare_linear(kind, w, s, groups), ref_linear.prepare_linear(kind, w, s, groups)
        want = ref_linear.linear(x, ref, torch.float32)
        check(getattr(linear, f"{kernel}_linear")(x, ours, torch.float32, cfg), want, kind, m, groups, kernel)
        if kernel == "block":  # a table's GEMV config (block_m < 16) at 8 tokens takes the GEMV
            assert torch.equal(linear.block_linear(x, ours, torch.float32, cfg),
                               linear.gemv_linear(x, ours, torch.float32, cfg))
        check(linear.linear(x, ours, torch.float32), want, kind, m, groups, "default")
        check(linear.dequant_linear(x, ours, torch.float32), want, kind, m, groups, "dequant")
        check(linear.linear(x, ours, torch.float32, batch_invariant=True), want, kind, m, groups, "inv")
# GEMV with 32-bit scale-word loads (scale rows a multiple of 4 bytes: 384 columns), the pipelined loop
# (num_stages 3, 4) and register prefetch over 3 steps (the last ragged), 1- to 8-row programs
w, s = quantize_fp8(torch.randn(64, 384) * 0.1)
for m, groups, cfg in ((1, 1, TileConfig(1, 1, 256, 1, 4, 3)), (2, 2, TileConfig(2, 2, 128, 1, 4, 4)),
                       (1, 1, TileConfig(8, 1, 128, 2, 4, 2)), (3, 2, TileConfig(4, 4, 512, 1, 4, 1)),
                       (1, 2, TileConfig(4, 1, 128, 1, 4, 2, pdl=1))):  # PDL: CUDA only, a plain launch here
    x = torch.randn(m, 384 * groups)
    ours = linear.prepare_linear("fp8", w, s, groups)
    want = ref_linear.linear(x, ref_linear.prepare_linear("fp8", w, s, groups), torch.float32)
    check(linear.gemv_linear(x, ours, torch.float32, cfg), want, "gemv words", m, groups, cfg)
for groups in (1, 2):  # dense and reference-prepared (partial 32-blocks) weights in invariant mode
    w = torch.randn(64, 48)
    x = torch.randn(5, 48 * groups)
    ref = ref_linear.prepare_linear("dense", w, None, groups)
    want = ref_linear.linear(x, ref, torch.float32)
    check(linear.linear(x, linear.prepare_linear("dense", w, None, groups), torch.float32,
                        batch_invariant=True), want, "dense", groups)
    wq, sq = quantize_fp8(torch.randn(64, 40) * 0.1)
    x = torch.randn(3, 40 * groups)
    ref = ref_linear.prepare_linear("fp8", wq, sq, groups)
    ours = linear.prepare_linear("fp8", wq, sq, groups)
    assert isinstance(ours, ref_linear.ReferenceLinear)
    want = ref_linear.linear(x, ref, torch.float32)
    check(linear.linear(x, ours, torch.float32, batch_invariant=True), want, "partial blocks", groups)
# the split summed inside each program (batch-invariant mode on large grids) adds the same partials in the
# same order as the split grid plus its reduction kernel: bitwise equal (FP8 grouped; dense, ragged K)
wq, sq = quantize_fp8(torch.randn(64, 160) * 0.1)
for kind, wt, st, groups in (("fp8", wq, sq, 2), ("dense", torch.randn(64, 100), None, 1)):
    ours = linear.prepare_linear(kind, wt, st, groups)
    x = torch.randn(5, wt.shape[1] * groups)
    cfg = TileConfig(32, 16, 32, 3, 4, 1)
    grid = linear.tiled_linear(x, ours, torch.float32, cfg)
    assert torch.equal(linear.tiled_linear(x, ours, torch.float32, cfg, split_loop=True), grid), kind
    # K steps of their own inside the config's (batch-invariant mode's large tiles; the split boundaries
    # stay the config's): right, in the grid and in the program (not bitwise here: numpy sums by shape)
    cfg = TileConfig(32, 16, 64, 2, 4, 1)
    want = ref_linear.linear(x, ref_linear.prepare_linear(kind, wt, st, groups), torch.float32)
    for loop in (False, True):
        check(linear.tiled_linear(x, ours, torch.float32, cfg, split_loop=loop, k_step=32), want, kind, loop)

e, h, i, k = 8, 64, 64, 3
layer, common = toy_moe(e, h, i, k)
ref = layer(ref_moe.prepare_experts, ref_linear.prepare_linear)
for fp8 in (False, True):  # experts as split-layout FP4, or re-encoded as E4M3
    ours = layer(lambda *w: moe.prepare_experts(*w, fp8=fp8), linear.prepare_linear)
    for t in (1, 5, 24):  # 3 and 15 assignments: decode GEMVs; 72: alignment and grouped GEMMs
        assert (t * k <= moe.DECODE_ASSIGNMENTS) == (t < 24)
        x = torch.randn(t, h)
        mask = torch.rand(t) < 0.5
        got = moe.moe(x, ours, mask)
        want = ref_moe.moe(x, ref, mask)
        assert rel(got, want) < 1e-5, (fp8, t, rel(got, want))
        if t * k <= moe.DECODE_ASSIGNMENTS:  # the decode path's MMA kernels: one block per assignment
            moe.DECODE_OVERRIDE = TileConfig(32, 16, 32, 1, 4, 1)
            assert rel(moe.moe(x, ours, mask), want) < 1e-5, ("direct", fp8, t)
            moe.DECODE_OVERRIDE = None
        inv = moe.moe(x, ours, mask, batch_invariant=True)  # fixed tiles at every size, shared expert too
        assert rel(inv, want) < 1e-5, ("invariant", fp8, t, rel(inv, want))
        assert torch.equal(moe.moe(x[:1], ours, mask[:1], batch_invariant=True)[0], inv[0])
# alignment above SMALL_ALIGN: the two alignment kernels build the torch ops' layout exactly (uniform
# routing, all on 6 of 64 experts, counts at block boundaries; block_m 16 and 64)
for ids in (torch.stack([torch.randperm(64)[:6] for _ in range(40)]),
            torch.stack([torch.randperm(6)[:6] for _ in range(700)]) * 7,
            torch.tensor([0] * 64 + [1] * 65 + [5] * 63 + [63] * 1).view(-1, 1)):
    for bm in (16, 64):
        moe.ALIGN_KERNELS = False
        want_al = moe.align(ids.int(), 64, bm)
        moe.ALIGN_KERNELS = True
        got_al = moe.align(ids.int(), 64, bm)
        assert torch.equal(got_al.row_assign, want_al.row_assign), (bm, ids.shape)
        assert torch.equal(got_al.block_expert, want_al.block_expert), (bm, ids.shape)
# NaN router logits rank first (torch.topk's order): ids stay in range, the row's weights are NaN
logits = torch.randn(3, e)
logits[1], logits[2, 5] = float("nan"), float("nan")
w_nan, ids_nan = moe.route(logits, common["bias"], common["bias_vl"], None, k, 2.5)
assert ids_nan[1].tolist() == list(range(k)) and ids_nan[2, 0] == 5 and w_nan[1:].isnan().all(), ids_nan
assert w_nan[0].isfinite().all()
print("ok")
"""


def test_kernels_match_reference_in_the_interpreter(run_in_interpreter):
    run_in_interpreter(_SCRIPT)
