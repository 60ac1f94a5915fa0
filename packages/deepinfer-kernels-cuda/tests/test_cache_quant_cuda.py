"""Cache codecs on the GPU: bytes and decoded values bit-identical to the reference (on the CPU, the
oracle: torch on CUDA divides by a scalar through its rounded reciprocal, the CPU divides)."""

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

FORMATS = ("fp8", "nvfp4", "mxfp4")


def _values(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random values over ~28 binades (within NVFP4's range: amax <= 6 * 448) with special groups:
    zeros, tiny, exact code maxima and ties. On the CPU."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-20, 8, shape, generator=g).float())
    flat = x.view(-1, shape[-1])
    flat[0, :32] = 0
    flat[-1, :32] = 1e-30
    flat[0, 32:64] = torch.tensor([0.25, 0.75, 1.75, 3.5, 5.0, 6.0, -448.0, 448.0] * 4)
    return x.to(dtype)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(3, 512), (2, 5, 128), (1000, 512), (7, 64)])
def test_quantize_bytes_match_reference(cuda_ops, ref_ops, poison, fmt, dtype, shape):
    x = _values(shape, dtype, seed=len(shape) * 1000 + shape[0])
    got = getattr(cuda_ops, f"{fmt}_quantize")(x.cuda())
    want = getattr(ref_ops, f"{fmt}_quantize")(x)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert torch.equal(a.cpu().view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_dequantize_matches_reference(cuda_ops, ref_ops, poison, fmt, dtype):
    data, scale = getattr(ref_ops, f"{fmt}_quantize")(_values((300, 512), torch.float32, seed=7))
    got = getattr(cuda_ops, f"{fmt}_dequantize")(data.cuda(), scale.cuda(), dtype).cpu()
    want = getattr(ref_ops, f"{fmt}_dequantize")(data, scale, dtype)
    assert got.dtype == want.dtype == dtype
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))  # bits, -0 included


def test_width_not_multiple_of_group_is_rejected(cuda_ops):
    with pytest.raises(ValueError, match="multiple of the quantisation group"):
        cuda_ops.nvfp4_quantize(torch.ones(2, 24, device="cuda"))
