"""Stacked decode projections at Flash widths on the GPU (wq_a + wkv, attention wq_b + indexer wq_b):
the stacked launch and its row-slice parts against the reference's separate linears."""

import pytest
import torch

from deepinfer.checkpoint.formats import quantize_fp8
from deepinfer.models.deepseek_v41.linear import make_fused_linear, make_linear
from deepinfer.models.deepseek_v41.weights import Weights
from deepinfer.ops import get_ops

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

STACKS = {
    "q_a+kv": [("wq_a", (1280, 5120)), ("wkv", (512, 5120))],
    "q_b+indexer": [("wq_b", (32768, 1280)), ("indexer.wq_b", (4096, 1280))],
}


@pytest.mark.parametrize("batch_invariant", [False, True])
@pytest.mark.parametrize("m", [1, 8, 64])
@pytest.mark.parametrize("stack", sorted(STACKS))
def test_stacked_projections_match_the_separate_reference_linears(ref_ops, stack, m, batch_invariant):
    g = torch.Generator(device="cuda").manual_seed(m)
    tensors = {}
    for name, shape in STACKS[stack]:
        tensors[f"{name}.weight"], tensors[f"{name}.scale"] = quantize_fp8(
            torch.randn(shape, device="cuda", generator=g) * 0.05
        )
    k = STACKS[stack][0][1][1]
    x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    want = [make_linear(Weights(tensors), n, ref_ops, torch.bfloat16, s)(x).float() for n, s in STACKS[stack]]
    ops = get_ops("cuda", "cuda", batch_invariant=batch_invariant)
    fused = make_fused_linear(Weights(dict(tensors)), STACKS[stack], ops, torch.bfloat16)
    assert fused.fused is not None
    for got, part, expected in zip(fused(x), fused.parts, want, strict=True):
        torch.testing.assert_close(got.float(), expected, rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(part(x).float(), expected, rtol=2e-2, atol=2e-2)
    if batch_invariant:  # a row's bits do not depend on the rows beside it
        alone = fused.stacked(x[:1])
        assert torch.equal(fused.stacked(x)[:1], alone)
