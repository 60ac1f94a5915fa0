"""Sparse sink attention on the GPU against the reference: decode (split keys) and prefill rows."""

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _inputs(t: int, heads: int, dim: int, n: int, k: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, heads, dim, generator=g).to(dtype).cuda()
    kv = torch.randn(n, dim, generator=g).to(dtype).cuda()
    idx = torch.randint(0, n, (t, k), generator=g)
    idx[torch.rand(t, k, generator=g) < 0.3] = -1  # padding inside the rows
    if t > 1:
        idx[-1] = -1  # a row with no key: only the sink
        idx[0, k // 2 :] = -1  # a short context
    return q, kv, idx.cuda(), (torch.randn(heads, generator=g) * 2).cuda(), dim**-0.5


@pytest.mark.parametrize(
    "t,heads,dim,n,k",
    [(1, 64, 512, 20000, 640), (4, 64, 512, 3000, 640), (300, 64, 512, 5000, 640), (7, 64, 512, 100, 5),
     (3, 8, 64, 50, 40), (200, 8, 64, 500, 130), (5, 128, 512, 700, 96)],
)
def test_sparse_attention_sink_bf16(cuda_ops, ref_ops, poison, t, heads, dim, n, k):
    args = _inputs(t, heads, dim, n, k, torch.bfloat16, seed=t * k)
    got, want = cuda_ops.sparse_attention_sink(*args), ref_ops.sparse_attention_sink(*args)
    assert got.shape == want.shape and got.dtype == torch.bfloat16
    err = (got.float() - want.float()).norm() / want.float().norm()
    assert err < 5e-3, err
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("t,n,k", [(2, 40, 17), (150, 300, 70)])
def test_sparse_attention_sink_fp32(cuda_ops, ref_ops, poison, t, n, k):
    args = _inputs(t, 4, 32, n, k, torch.float32, seed=k)
    torch.testing.assert_close(cuda_ops.sparse_attention_sink(*args), ref_ops.sparse_attention_sink(*args),
                               atol=1e-5, rtol=1e-5)


def test_int32_indices(cuda_ops, ref_ops):
    q, kv, idx, sink, scale = _inputs(2, 64, 512, 1000, 200, torch.bfloat16, seed=3)
    torch.testing.assert_close(cuda_ops.sparse_attention_sink(q, kv, idx.int(), sink, scale),
                               ref_ops.sparse_attention_sink(q, kv, idx, sink, scale), atol=2e-2, rtol=2e-2)
