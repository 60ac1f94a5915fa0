"""Float32 dense weights of BF16 models (LM head, compressor projections) held in BF16 by the cuda backend
and multiplied BF16 x BF16 into float32 logits, as the official engine does; float32 models keep them."""

import pytest
import torch

from deepinfer_kernels_cuda import linear


@pytest.mark.parametrize(
    ("operand", "stored"),
    [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32), (None, torch.float32)],
)
def test_float32_dense_weight_is_stored_in_the_operand_dtype(operand, stored):
    w = torch.randn(48, 32)
    prepared = linear.prepare_linear("dense", w, None, operand_dtype=operand)
    assert prepared.weight.dtype == stored
    assert torch.equal(prepared.weight.float(), w.to(stored).float())
    bf16 = linear.prepare_linear("dense", w.bfloat16(), None, operand_dtype=torch.float32)
    assert bf16.weight.dtype == torch.bfloat16  # never widened


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("batch_invariant", [False, True])
@pytest.mark.parametrize("m", [1, 64])
@pytest.mark.parametrize("n", [1000, 129280])  # the Flash vocabulary: the real head's shape
def test_bf16_head_gives_float32_logits_of_the_rounded_weight(n, m, batch_invariant):
    g = torch.Generator(device="cuda").manual_seed(n + m)
    w = torch.randn(n, 5120, device="cuda", generator=g) * 0.02
    x = torch.randn(m, 5120, device="cuda", generator=g).bfloat16()
    prepared = linear.prepare_linear("dense", w, None, operand_dtype=torch.bfloat16)
    got = linear.linear(x, prepared, torch.float32, batch_invariant=batch_invariant)
    assert got.dtype == torch.float32 and got.shape == (m, n)
    want = x.double() @ w.bfloat16().double().T  # BF16 products are exact: only summation order differs
    # float32 sums of 5120 products of logits ~1.4: rounding ~1e-5 (H200: 3.5e-5 at most over 8M logits)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    # against the reference's float32 weight: the BF16 rounding of the weight, ~2^-9 relative per weight
    exact = x.double() @ w.double().T
    assert (got.double() - exact).abs().max() < 2e-2 * exact.abs().max()
