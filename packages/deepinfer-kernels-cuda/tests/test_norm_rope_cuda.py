"""RMSNorm + interleaved RoPE in one pass (op `rms_norm_rope`) on the GPU: the window key and index key
shapes, against the reference and against the two cuda ops one after the other."""

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("rows", "dim", "pairs"), [(1, 512, 32), (64, 512, 32), (7, 128, 32), (3, 24, 4)])
def test_rms_norm_rope_matches_reference_and_the_two_ops(cuda_ops, ref_ops, poison, rows, dim, pairs, dtype):
    g = torch.Generator(device="cuda").manual_seed(rows + dim)
    stacked = (torch.randn(rows, dim + 64, device="cuda", generator=g) * 4).to(dtype)
    x = stacked[:, 64:]  # a view of a stacked projection's output, as in the model
    w = (torch.rand(dim, device="cuda", generator=g) + 0.5).to(dtype)
    angles = torch.rand(rows, pairs, device="cuda", generator=g) * torch.logspace(6, -4, pairs, device="cuda")
    got = cuda_ops.rms_norm_rope(x, w, 1e-6, angles)
    assert got.dtype == dtype and got.shape == (rows, dim)
    assert torch.equal(got, cuda_ops.rope_interleaved(cuda_ops.rms_norm(x, w, 1e-6), angles))
    tol = (1e-5, 2**-7) if dtype == torch.bfloat16 else (1e-5, 1e-5)
    torch.testing.assert_close(got, ref_ops.rms_norm_rope(x, w, 1e-6, angles), atol=tol[0], rtol=tol[1])
    # row-wise: a row's result does not depend on the rows beside it
    assert torch.equal(cuda_ops.rms_norm_rope(x[-1:], w, 1e-6, angles[-1:]), got[-1:])
