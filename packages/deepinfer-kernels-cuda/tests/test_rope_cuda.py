"""Interleaved RoPE on the GPU against the reference (forward and inverse), and in place: the copying
kernel's values, bitwise."""

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    "shape,pairs",
    [((5, 64, 512), 32), ((3, 32, 128), 32), ((9, 512), 32), ((4, 8, 64), 8), ((1, 2, 3, 24), 12),
     ((6, 16), 8)],
)
def test_rope_matches_reference(cuda_ops, ref_ops, poison, shape, pairs, dtype, inverse):
    torch.manual_seed(shape[0] + pairs)
    x = torch.randn(shape, device="cuda", dtype=dtype)
    # YaRN-scale angles: positions up to 1M times frequencies down to 1e-4
    angles = torch.rand(shape[0], pairs, device="cuda") * torch.logspace(6, 0, pairs, device="cuda")
    got = cuda_ops.rope_interleaved(x, angles, inverse=inverse)
    want = ref_ops.rope_interleaved(x, angles, inverse=inverse)
    assert got.shape == want.shape and got.dtype == want.dtype
    keep = shape[-1] - 2 * pairs
    assert torch.equal(got[..., :keep], x[..., :keep])
    tol = (1e-5, 2**-7) if dtype == torch.bfloat16 else (1e-5, 1e-5)  # one bf16 ulp at most
    torch.testing.assert_close(got, want, atol=tol[0], rtol=tol[1])
    # in place, also in a strided view of a wider buffer (the fused projections' parts): the same bits
    y = x.clone()
    assert cuda_ops.rope_interleaved(y, angles, inverse=inverse, inplace=True) is y
    assert torch.equal(y, got)
    buf = torch.randn(*shape[:-1], shape[-1] + 16, device="cuda", dtype=dtype)
    view, edge = buf[..., 8 : 8 + shape[-1]], buf.clone()
    view.copy_(x)
    cuda_ops.rope_interleaved(view, angles, inverse=inverse, inplace=True)
    assert torch.equal(view, got)
    assert torch.equal(buf[..., :8], edge[..., :8]) and torch.equal(buf[..., -8:], edge[..., -8:])


def test_rope_then_inverse_round_trips(cuda_ops):
    x = torch.randn(4, 8, 64, device="cuda")
    angles = torch.rand(4, 16, device="cuda") * 100
    back = cuda_ops.rope_interleaved(cuda_ops.rope_interleaved(x, angles), angles, inverse=True)
    torch.testing.assert_close(back, x, atol=1e-5, rtol=1e-5)
