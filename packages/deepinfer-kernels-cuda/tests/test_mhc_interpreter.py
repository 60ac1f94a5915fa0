"""mHC coefficients under Triton's CPU interpreter against the reference op (float32 streams: the
interpreter's bf16 cast and dot are wrong, so the bf16 path is checked on the GPU only): row counts that
take one or several row blocks and projection chunks (a ragged last chunk), default and invariant mode;
in invariant mode rows' coefficients bitwise the same alone and at other places of a batch of 70 (the
interpreter's numpy matmul summed a row by its place in the tile on some CPUs). T = 1 and 20 take the
latency path, T = 70 and invariant mode (float32 streams) the rows path; invariant mode with bf16 streams the
split path at every T (ROW_SUMS products here). The fused ops the same way: hc_residual (on the
latency path its own kernel finishing the coefficients) against the reference, hc_collapse_norm bitwise
as the collapse and norm kernels composed."""

import pytest

_SCRIPT = r"""
import torch
from deepinfer.ops.reference import mhc as ref
from deepinfer_kernels_cuda import mhc as ker

g = torch.Generator().manual_seed(0)
m = 4
for t, h in ((1, 160), (20, 100), (70, 160)):  # K 640 / 400: 2-3 chunks, ragged tails; 16- and 64-row tiles
    streams = torch.randn(t, m, h, generator=g) * 3
    fn = torch.randn(m * (m + 2), m * h, generator=g) * (m * h) ** -0.5
    base = torch.randn(m * (m + 2), generator=g) * 0.5
    scale = torch.rand(3, generator=g) + 0.5
    args = (streams, fn, base, scale, 20, 1e-6, 1e-6)
    want = ref.hc_coefficients(*args)
    for invariant in (False, True):
        got = ker.hc_coefficients(*args, batch_invariant=invariant)
        for name, a, b in zip(("pre", "post", "comb"), got, want, strict=True):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5, msg=lambda s, n=name: f"{t} {n}: {s}")
for lo, hi in ((0, 1), (6, 12), (60, 70)):  # rows at other places of a tile and across two tiles
    alone = ker.hc_coefficients(streams[lo:hi], *args[1:], batch_invariant=True)
    for a, b in zip(alone, got, strict=True):
        assert torch.equal(a, b[lo:hi]), (lo, hi)
print("ok")
"""


@pytest.mark.slow
def test_hc_coefficients_match_reference_in_the_interpreter(run_in_interpreter):
    run_in_interpreter(_SCRIPT)


_FUSED_SCRIPT = r"""
import torch
from deepinfer.ops.reference import mhc as ref
from deepinfer_kernels_cuda import mhc as ker, norm

g = torch.Generator().manual_seed(1)
m = 4
for t, h in ((3, 100), (70, 40)):  # K 400: 2 latency chunks, a ragged tail; 70 rows: the rows path
    streams = torch.randn(t, m, h, generator=g) * 3
    fn = torch.randn(m * (m + 2), m * h, generator=g) * (m * h) ** -0.5
    args = (streams, fn, torch.randn(m * (m + 2), generator=g) * 0.5, torch.rand(3, generator=g) + 0.5, 20,
            1e-6, 1e-6)
    y = torch.randn(t, h, generator=g)
    want_streams, want_pre = ref.hc_residual(y, *args)
    got_streams, got_pre = ker.hc_residual(y, *args)
    torch.testing.assert_close(got_pre, want_pre, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(got_streams, want_streams, atol=1e-4, rtol=1e-4)
    pre, w = torch.rand(t, m, generator=g) + 0.1, torch.rand(h, generator=g) + 0.5
    fused = ker.hc_collapse_norm(streams, pre, w, 1e-6)
    assert torch.equal(fused, norm.rms_norm(ker.hc_collapse(streams, pre), w, 1e-6)), t
print("ok")
"""


@pytest.mark.slow
def test_fused_mhc_ops_match_in_the_interpreter(run_in_interpreter):
    run_in_interpreter(_FUSED_SCRIPT)


# the split path's projection kernel: its row tiles, column chunks and steps (a ragged last chunk and step,
# a partial row tile) against a float64 product. The kernel takes any operand dtype; float32 here, since
# the interpreter's bf16 cast and dot are wrong (the bf16 split itself is checked on the GPU)
_SPLIT_SCRIPT = r"""
import torch
import triton
from deepinfer_kernels_cuda import mhc as ker

g = torch.Generator().manual_seed(2)
# (chain: columns per tensor-core accumulation chain, 0 = the program's; 128 of 256 and a ragged last chain)
for t, k, block_t, chunk, block_k, chain in ((70, 640, 64, 256, 64, 0), (130, 400, 16, 128, 32, 0),
                                             (70, 640, 64, 256, 64, 128), (130, 600, 16, 256, 32, 96)):
    x = torch.randn(t, k, generator=g)
    parts = torch.randn(3, 32, k, generator=g)
    splits = triton.cdiv(k, chunk)
    part, sq = torch.full((splits, t, 32), float("nan")), torch.full((splits, t), float("nan"))
    ker._hc_project_split_kernel[(triton.cdiv(t, block_t), splits)](
        x, parts, part, sq, t, k, x.stride(0), K_CHUNK=chunk, BLOCK_T=block_t, BLOCK_K=block_k, BLOCK_N=32,
        CHAIN=chain)
    want = x.double() @ parts.double().sum(0).T
    torch.testing.assert_close(part.sum(0).double(), want, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(sq.sum(0), (x * x).sum(1), atol=1e-3, rtol=1e-5)
print("ok")
"""


@pytest.mark.slow
def test_split_projection_tiles_in_the_interpreter(run_in_interpreter):
    run_in_interpreter(_SPLIT_SCRIPT)


# batch-invariant mode with bf16 streams: the split path at every T (ROW_SUMS products off CUDA) and the
# one-program-per-row finish; rows bitwise alone and at other places of a batch of 70, and near the reference
_INVARIANT_BF16_SCRIPT = r"""
import torch
from deepinfer.ops.reference import mhc as ref
from deepinfer_kernels_cuda import mhc as ker

g = torch.Generator().manual_seed(3)
m, h, t = 4, 160, 70  # K 640: 3 chunks of 256, a ragged last one; two 64-row tiles
streams = (torch.randn(t, m, h, generator=g) * 3).bfloat16()
fn = torch.randn(m * (m + 2), m * h, generator=g) * (m * h) ** -0.5
args = (fn, torch.randn(m * (m + 2), generator=g) * 0.5, torch.rand(3, generator=g) + 0.5, 20, 1e-6, 1e-6)
assert ker._split_path(streams[:1], True) and not ker._split_path(streams[:1], False)
full = ker.hc_coefficients(streams, *args, batch_invariant=True)
for a, b in zip(full, ref.hc_coefficients(streams.float(), *args), strict=True):
    torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)
for lo, hi in ((0, 1), (6, 12), (60, 70), (63, 66)):
    alone = ker.hc_coefficients(streams[lo:hi], *args, batch_invariant=True)
    assert all(torch.equal(a, b[lo:hi]) for a, b in zip(alone, full, strict=True)), (lo, hi)
y = torch.randn(t, h, generator=g).bfloat16()
new, pre = ker.hc_residual(y, streams, *args, batch_invariant=True)
alone, alone_pre = ker.hc_residual(y[5:6], streams[5:6], *args, batch_invariant=True)
assert torch.equal(alone, new[5:6]) and torch.equal(alone_pre, pre[5:6])
print("ok")
"""


@pytest.mark.slow
def test_invariant_bf16_split_path_in_the_interpreter(run_in_interpreter):
    run_in_interpreter(_INVARIANT_BF16_SCRIPT)
