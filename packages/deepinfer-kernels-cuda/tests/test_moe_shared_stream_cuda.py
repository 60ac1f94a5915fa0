"""The MoE layer's shared expert on a second stream (`moe.SHARED_STREAM`, the unfused path above
DECODE_ASSIGNMENTS): the same kernels as on one stream, so the output is bitwise the one-stream output,
eagerly, for back-to-back calls whose temporaries the caching allocator hands between the two streams,
and replayed from a CUDA graph (the second stream joins the capture)."""

import pytest
import torch

from deepinfer.checkpoint.formats import quantize_fp4, quantize_fp8
from deepinfer.ops.weights import MoEWeights
from deepinfer_kernels_cuda import moe

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

E, H, INTER, K = 32, 256, 128, 4


def _layer(cuda_ops) -> MoEWeights:
    def experts(rows, cols):
        packed = [quantize_fp4(torch.randn(rows, cols, device="cuda") * 0.05) for _ in range(E)]
        return torch.stack([w for w, _ in packed]), torch.stack([s for _, s in packed])

    shapes = ((INTER, H), (INTER, H), (H, INTER))
    shared = [quantize_fp8(torch.randn(*s, device="cuda") * 0.05) for s in shapes]
    return MoEWeights(
        experts=cuda_ops.prepare_experts(*experts(INTER, H), *experts(INTER, H), *experts(H, INTER)),
        shared_w1=cuda_ops.prepare_linear("fp8", *shared[0]),
        shared_w3=cuda_ops.prepare_linear("fp8", *shared[1]),
        shared_w2=cuda_ops.prepare_linear("fp8", *shared[2]),
        gate=(torch.randn(E, H, device="cuda") * 0.05).bfloat16(),
        bias=torch.randn(E, device="cuda") * 0.1,
        bias_vl=torch.randn(E, device="cuda") * 0.1,
        topk=K,
        route_scale=2.5,
        swiglu_limit=10.0,
        dtype=torch.bfloat16,
    )


@pytest.mark.parametrize("tokens", [40, 300])  # 160 / 1200 assignments: the unfused path
@pytest.mark.parametrize("invariant", [False, True])
def test_shared_stream_output_is_the_one_stream_output(cuda_ops, monkeypatch, tokens, invariant):
    torch.manual_seed(tokens)
    layer = _layer(cuda_ops)
    xs = [torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16) for _ in range(6)]
    run = lambda x: moe.moe(x, layer, batch_invariant=invariant)  # noqa: E731
    monkeypatch.setattr(moe, "SHARED_STREAM", False)
    want = [run(x) for x in xs]
    monkeypatch.setattr(moe, "SHARED_STREAM", True)
    got = [run(x) for x in xs]  # back to back, no sync between calls
    torch.cuda.synchronize()
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)

    static_x = xs[0].clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = run(static_x)
    for x, w in zip(xs, want, strict=True):
        static_x.copy_(x)
        graph.replay()
        assert torch.equal(static_out, w)
