"""The linear and MoE kernels under Triton's CPU interpreter (float32, tiny shapes) against the reference
ops: kernel logic (indexing, masks, split-K, groups, FP4/FP8 decode, routing, alignment) checked without a
GPU. The interpreter must be switched on before triton is imported, hence a subprocess."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

_SCRIPT = r"""
import torch
from deepinfer.checkpoint.formats import quantize_fp4, quantize_fp8
from deepinfer.ops.reference import linear as ref_linear, moe as ref_moe
from deepinfer.ops.weights import MoEWeights
from deepinfer_kernels_cuda import linear, moe
from deepinfer_kernels_cuda.configs import TileConfig

torch.manual_seed(0)
def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())

for kind, quant in (("fp8", quantize_fp8), ("fp4", quantize_fp4)):
    # M <= GEMV_M: the GEMV kernel (block_m unused), else the MMA kernel
    for m, groups, cfg in ((1, 2, TileConfig(8, 1, 32, 1, 4, 1)), (3, 1, TileConfig(32, 16, 64, 2, 4, 1)),
                           (17, 2, TileConfig(32, 16, 32, 1, 4, 1))):
        w, s = quant(torch.randn(64, 64) * 0.1)
        x = torch.randn(m, 64 * groups)
        got = linear.block_linear(x, linear.prepare_linear(kind, w, s, groups), torch.float32, cfg)
        want = ref_linear.linear(x, ref_linear.prepare_linear(kind, w, s, groups), torch.float32)
        assert rel(got, want) < 1e-5, (kind, m, groups, rel(got, want))

e, h, i, k = 8, 64, 64, 3
def experts(rows, cols):
    q = [quantize_fp4(torch.randn(rows, cols) * 0.1) for _ in range(e)]
    return torch.stack([a for a, _ in q]), torch.stack([b for _, b in q])
w1, w3, w2 = experts(i, h), experts(i, h), experts(h, i)
shared = [quantize_fp8(torch.randn(*shape) * 0.1) for shape in ((i, h), (i, h), (h, i))]
common = dict(gate=torch.randn(e, h).bfloat16(), bias=torch.randn(e) * 0.1, bias_vl=torch.randn(e) * 0.1,
              topk=k, route_scale=2.5, swiglu_limit=1.0, dtype=torch.float32)
def layer(prep_e, prep_l):
    return MoEWeights(experts=prep_e(*w1, *w3, *w2), shared_w1=prep_l("fp8", *shared[0]),
                      shared_w3=prep_l("fp8", *shared[1]), shared_w2=prep_l("fp8", *shared[2]), **common)
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
print("ok")
"""


def test_kernels_match_reference_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
