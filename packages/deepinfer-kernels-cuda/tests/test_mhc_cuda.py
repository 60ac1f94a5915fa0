"""mHC kernels on the GPU against the reference: coefficients (with Sinkhorn), collapse, expand, and the
fused collapse + norm and coefficients + expand."""

import pytest
import torch

from deepinfer_kernels_cuda.mhc import hc_coefficients, hc_residual

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

M = 4
ONE_BF16_ULP = dict(atol=1e-5, rtol=2**-7)
TWO_BF16_ULPS = dict(atol=1e-5, rtol=2**-6)  # two rounding points: the collapse, then the norm


def _streams(t: int, h: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(t, M, h, generator=g) * 3).to(torch.bfloat16).cuda()


def _coefficient_args(t: int, h: int, dtype: torch.dtype = torch.bfloat16) -> tuple:
    g = torch.Generator().manual_seed(t * h)
    streams = _streams(t, h, seed=t + h).to(dtype)
    fn = (torch.randn(M * (M + 2), M * h, generator=g) * (M * h) ** -0.5).cuda()
    base = (torch.randn(M * (M + 2), generator=g) * 0.5).cuda()
    scale = (torch.rand(3, generator=g) + 0.5).cuda()
    return streams, fn, base, scale, 20, 1e-6, 1e-6


# bf16 streams at decode sizes (16-row tiles: three bf16 products) and past 64 rows (the split path: the same
# products against the matrix split beforehand), float32 streams
@pytest.mark.parametrize("t,h,dtype", [(1, 128, torch.bfloat16), (5, 128, torch.bfloat16),
                                       (70, 128, torch.bfloat16), (1, 5120, torch.bfloat16),
                                       (33, 5120, torch.bfloat16), (2048, 5120, torch.bfloat16),
                                       (1, 5120, torch.float32), (70, 1000, torch.float32)])
def test_hc_coefficients_match_reference(cuda_ops, ref_ops, poison, t, h, dtype):
    args = _coefficient_args(t, h, dtype)
    got, want = cuda_ops.hc_coefficients(*args), ref_ops.hc_coefficients(*args)
    for name, a, b in zip(("pre", "post", "comb"), got, want, strict=True):
        assert a.shape == b.shape and a.dtype == torch.float32, name
        torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5, msg=lambda m, n=name: f"{n}: {m}")


def test_invariant_hc_coefficients_are_bitwise_alone_and_in_batches():
    """Three rows alone, then at the start, middle and end of batches (bf16: the split path at every T,
    the rows' places in its 64-row tiles changing; float32: the rows path)."""
    for dtype, sizes in ((torch.bfloat16, (2, 16, 17, 64, 65, 300, 4096)), (torch.float32, (2, 17, 300))):
        streams, *rest = _coefficient_args(max(sizes) + 3, 5120, dtype)
        alone = [torch.cat(c) for c in zip(*(hc_coefficients(streams[i:i + 1], *rest, batch_invariant=True)
                                             for i in range(3)), strict=True)]
        for rows in sizes:
            where = [0, rows // 2, rows - 1][:min(rows, 3)]
            batch = streams[3:3 + rows].clone()
            batch[where] = streams[:len(where)]
            got = hc_coefficients(batch, *rest, batch_invariant=True)
            for a, b in zip(alone, got, strict=True):
                assert torch.equal(a[:len(where)], b[where]), (dtype, rows)


@pytest.mark.parametrize("t,h", [(1, 128), (9, 5120), (64, 1000)])
def test_hc_collapse_matches_reference(cuda_ops, ref_ops, poison, t, h):
    streams = _streams(t, h, seed=h)
    pre = torch.rand(t, M, device="cuda") + 0.1
    got, want = cuda_ops.hc_collapse(streams, pre), ref_ops.hc_collapse(streams, pre)
    torch.testing.assert_close(got, want, **ONE_BF16_ULP)


@pytest.mark.parametrize("t,h", [(1, 128), (9, 5120), (64, 1000)])
def test_hc_expand_matches_reference(cuda_ops, ref_ops, poison, t, h):
    streams = _streams(t, h, seed=h + 1)
    y = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
    post = torch.rand(t, M, device="cuda") * 2
    comb = torch.rand(t, M, M, device="cuda")
    got, want = cuda_ops.hc_expand(y, streams, post, comb), ref_ops.hc_expand(y, streams, post, comb)
    assert got.shape == want.shape == (t, M, h)
    torch.testing.assert_close(got, want, **ONE_BF16_ULP)


def _assert_expansions_close(got, want, y, streams, post, comb) -> None:
    """The fused op computes its own coefficients (within 2e-5 of the reference's, as tested above): an
    element where post * y and the mixed streams nearly cancel may differ by that relative error of its
    terms' magnitude, which is far more than one ulp of the small result."""
    terms = post.abs().unsqueeze(-1) * y.float().abs().unsqueeze(-2)
    terms += (comb.abs().unsqueeze(-1) * streams.float().abs().unsqueeze(-2)).sum(-3)
    bound = ONE_BF16_ULP["atol"] + ONE_BF16_ULP["rtol"] * want.float().abs() + 2e-5 * terms
    excess = (got.float() - want.float()).abs() - bound
    beyond = int((excess > 0).sum())
    assert beyond == 0, f"{beyond} elements beyond the bound, the worst at flat index {int(excess.argmax())}"


@pytest.mark.parametrize("t,h", [(1, 128), (1, 5120), (33, 5120), (70, 128), (2048, 5120)])
def test_hc_residual_matches_reference_and_the_two_ops(cuda_ops, ref_ops, poison, t, h):
    streams, *rest = _coefficient_args(t, h)
    y = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
    got, got_pre = cuda_ops.hc_residual(y, streams, *rest)
    want, want_pre = ref_ops.hc_residual(y, streams, *rest)
    assert got.shape == (t, M, h) and got.dtype == y.dtype and got_pre.dtype == torch.float32
    torch.testing.assert_close(got_pre, want_pre, atol=2e-5, rtol=2e-5)
    _assert_expansions_close(got, want, y, streams, *ref_ops.hc_coefficients(streams, *rest)[1:])
    pre, post, comb = cuda_ops.hc_coefficients(streams, *rest)
    torch.testing.assert_close(got, cuda_ops.hc_expand(y, streams, post, comb), **ONE_BF16_ULP)
    torch.testing.assert_close(got_pre, pre, atol=1e-6, rtol=1e-6)


def test_invariant_hc_residual_is_bitwise_alone_and_in_batches():
    streams, *rest = _coefficient_args(2048, 5120)
    y = torch.randn(2048, 5120, device="cuda", dtype=torch.bfloat16)
    alone = hc_residual(y[:1], streams[:1], *rest, batch_invariant=True)
    for rows in (2, 17, 100, 2048):
        batch = hc_residual(y[:rows], streams[:rows], *rest, batch_invariant=True)
        for a, b in zip(alone, batch, strict=True):
            assert torch.equal(a, b[:1]), rows


@pytest.mark.parametrize("t,h", [(1, 5120), (9, 5120), (64, 1000), (2048, 5120)])
def test_hc_collapse_norm_is_the_two_ops_bitwise(cuda_ops, ref_ops, poison, t, h):
    streams = _streams(t, h, seed=h + 2)
    pre = torch.rand(t, M, device="cuda") + 0.1
    w = (torch.rand(h, device="cuda") + 0.5).to(torch.bfloat16)
    got = cuda_ops.hc_collapse_norm(streams, pre, w, 1e-6)
    assert torch.equal(got, cuda_ops.rms_norm(cuda_ops.hc_collapse(streams, pre), w, 1e-6))
    torch.testing.assert_close(got, ref_ops.hc_collapse_norm(streams, pre, w, 1e-6), **TWO_BF16_ULPS)
