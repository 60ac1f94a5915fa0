"""Lightning-indexer scores on the GPU against the reference, within the documented bound."""

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("t,heads,dim,n", [(1, 32, 128, 5000), (3, 32, 128, 1), (70, 32, 128, 333),
                                           (5, 16, 32, 100), (2, 4, 32, 17)])
def test_indexer_logits_match_reference(cuda_ops, ref_ops, poison, t, heads, dim, n, dtype):
    torch.manual_seed(t * n)
    q = torch.randn(t, heads, dim, device="cuda", dtype=dtype)
    k = torch.randn(n, dim, device="cuda", dtype=dtype)
    w = torch.randn(t, heads, device="cuda", dtype=dtype) * heads**-0.5
    got, want = cuda_ops.indexer_logits(q, k, w), ref_ops.indexer_logits(q, k, w)
    assert got.shape == (t, n) and got.dtype == torch.float32
    # per-head terms are rounded to `dtype` in both; a rounding can flip by one ulp (2^-7) twice
    terms = (torch.einsum("thd,nd->thn", q.double(), k.double()).relu() * w.double().unsqueeze(-1)).abs()
    ulp = 2**-6 if dtype == torch.bfloat16 else 1e-6
    bound = terms.sum(1) * ulp + 1e-6
    assert ((got.double() - want.double()).abs() <= bound).all()
