"""The Triton RMSNorm against the reference op (the oracle for every kernel)."""

import pytest
import torch

from deepinfer.ops import get_ops

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 64), (7, 5120), (3, 4, 1280), (2, 512)])
def test_rms_norm_matches_reference(dtype, shape):
    torch.manual_seed(0)
    x = torch.randn(shape, device="cuda", dtype=dtype) * 3
    w = torch.rand(shape[-1], device="cuda", dtype=torch.bfloat16) + 0.5
    cuda_ops = get_ops("cuda", "cuda")
    assert "rms_norm" not in cuda_ops.fallbacks
    got = cuda_ops.rms_norm(x, w, 1e-20)
    want = get_ops("reference", "cuda").rms_norm(x, w, 1e-20)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
