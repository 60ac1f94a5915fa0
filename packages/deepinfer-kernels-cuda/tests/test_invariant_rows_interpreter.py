"""Batch-invariant linears and MoE under Triton's CPU interpreter: rows bitwise the same alone and at other
places of a batch. The interpreter's tl.dot is numpy's matmul, whose BLAS kernel may sum an output by its
place in the tile (OpenBLAS 0.3.31's Haswell sgemm, picked on an AMD Zen 5: the linear tile's token
columns 8-55 of 64, the router tile's rows 6-15 of 16, unlike the first), so invariant mode sums the
products with tl.sum there (`ROW_SUMS`; CUDA keeps tl.dot). Linears: FP8, FP4 and dense weights, one and
two groups, the in-register decode and (DEQUANT_M 16) the decoded-once twin in the batch, rows inside the
64-token tile and across two tiles. MoE: FP4 and E4M3 experts, rows inside and across the router's 16-row
tiles, alone on the fused decode path or the grouped kernels against the grouped kernels in a batch of 40.
Float32 operands (the interpreter's bf16 is wrong); each batch also against the reference op."""

import pytest

pytestmark = pytest.mark.slow

_SCRIPT = r"""
import torch
from deepinfer.checkpoint.formats import quantize_fp4, quantize_fp8
from deepinfer.ops.reference import linear as ref_linear, moe as ref_moe
from deepinfer.testing.moe import toy_moe
from deepinfer_kernels_cuda import configs, linear, moe

torch.manual_seed(0)
def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())

failed = []
quant = {"fp8": quantize_fp8, "fp4": quantize_fp4}
for kind in ("fp8", "fp4", "dense"):
    for groups in (1, 2):
        wf = torch.randn(128, 192) * 0.1  # 64 rows per group; K 192: 3 K steps of 64 (float32 operands)
        w, s = quant[kind](wf) if kind != "dense" else (wf, None)
        ours = linear.prepare_linear(kind, w, s, groups)
        x = torch.randn(70, 192 * groups)  # 70 tokens: two 64-token tiles
        want = ref_linear.linear(x, ref_linear.prepare_linear(kind, w, s, groups), torch.float32)
        for dequant_m in (512, 16):  # 16: the batch on the decoded-once twin, 1 and 6 rows in registers
            configs.DEQUANT_M = dequant_m
            full = linear.linear(x, ours, torch.float32, batch_invariant=True)
            assert rel(full, want) < 1e-5, (kind, groups, rel(full, want))
            for lo, hi in ((0, 1), (6, 12), (60, 70)):  # rows at other places of a tile and across two tiles
                alone = linear.linear(x[lo:hi], ours, torch.float32, batch_invariant=True)
                if not torch.equal(alone, full[lo:hi]):
                    failed.append(("linear", kind, groups, dequant_m, lo, hi))
configs.DEQUANT_M = 512

e, h, i, k = 8, 128, 64, 3  # H 128: the router's one K step of 128
layer, common = toy_moe(e, h, i, k)
ref = layer(ref_moe.prepare_experts, ref_linear.prepare_linear)
x = torch.randn(40, h)  # 120 assignments: the grouped kernels
mask = torch.rand(40) < 0.5
want = ref_moe.moe(x, ref, mask)
for fp8 in (False, True):
    ours = layer(lambda *w: moe.prepare_experts(*w, fp8=fp8), linear.prepare_linear)
    full = moe.moe(x, ours, mask, batch_invariant=True)
    assert rel(full, want) < 1e-5, (fp8, rel(full, want))
    # alone: 1-10 tokens on the fused decode path (<= 64 assignments), 25 on the grouped kernels; rows
    # inside the router's first 16-row tile, across two, and shifted by 10
    for lo, hi in ((0, 1), (6, 12), (12, 20), (30, 40), (10, 35)):
        alone = moe.moe(x[lo:hi], ours, mask[lo:hi], batch_invariant=True)
        if not torch.equal(alone, full[lo:hi]):
            failed.append(("moe", fp8, lo, hi))
assert not failed, failed
print("ok")
"""


def test_invariant_rows_bitwise_at_any_place_in_the_interpreter(run_in_interpreter):
    run_in_interpreter(_SCRIPT)
