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
    # float32 dots differ by summation order (~1e-5 of sum_d |q_d k_d|); a per-head term rounded to
    # bf16 can then land one ulp (2^-7) away, twice (the dot and the weighted term)
    dots = torch.einsum("thd,nd->thn", q.double(), k.double())
    magnitude = torch.einsum("thd,nd->thn", q.double().abs(), k.double().abs())
    ulp = 2**-6 if dtype == torch.bfloat16 else 0.0
    bound = ((dots.relu() * ulp + magnitude * 1e-5) * w.double().abs().unsqueeze(-1)).sum(1) + 1e-6
    assert ((got.double() - want.double()).abs() <= bound).all()
