"""Interleaved RoPE under Triton's CPU interpreter against the reference op: cos/sin computed in the
kernel from the angles (large YaRN-scale angles included), forward and inverse, rows split over
programs, untouched leading channels, strided input; in place (strided views too) equal to the copying
kernel and the reference's in-place op; RMSNorm + RoPE in one pass equal to the two
kernels one after the other. The interpreter must be switched on before triton
is imported, hence a subprocess."""

import pytest

pytestmark = pytest.mark.slow

_SCRIPT = r"""
import torch
from deepinfer.ops.reference.rotary import rms_norm_rope as ref_norm_rope, rope_interleaved as ref_rope
from deepinfer_kernels_cuda.norm import rms_norm
from deepinfer_kernels_cuda.rope import rms_norm_rope, rope_interleaved

g = torch.Generator().manual_seed(0)
# (x shape, rotated pairs): MQA heads, a single row, partial rotation, rows over several programs
cases = [((3, 4, 64), 32), ((2, 40), 8), ((5, 24), 12), ((1, 130, 32), 16), ((4, 2, 3, 16), 4)]
for shape, pairs in cases:
    x = torch.randn(shape, generator=g)
    # positions up to 1M times frequencies down to 1e-4
    angles = torch.rand(shape[0], pairs, generator=g) * torch.logspace(6, -4, pairs)
    for inverse in (False, True):
        got = rope_interleaved(x, angles, inverse=inverse)
        want = ref_rope(x, angles, inverse=inverse)
        keep = shape[-1] - 2 * pairs
        assert torch.equal(got[..., :keep], x[..., :keep]), shape
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
wide = torch.randn(3, 4, 80, generator=g)[..., :64]  # rows of a wider buffer
angles = torch.rand(3, 32, generator=g) * 100
torch.testing.assert_close(rope_interleaved(wide, angles), ref_rope(wide, angles), atol=1e-5, rtol=1e-5)

# in place: the copying kernel's values in x itself (contiguous, a strided view, a transposed view that
# cannot be viewed as [N, rows, D]), the buffer around the view untouched; the reference's in-place op
for shape, pairs in cases:
    x = torch.randn(shape, generator=g)
    angles = torch.rand(shape[0], pairs, generator=g) * torch.logspace(6, -4, pairs)
    for inverse in (False, True):
        want = rope_interleaved(x, angles, inverse=inverse)
        y = x.clone()
        assert rope_interleaved(y, angles, inverse=inverse, inplace=True) is y
        assert torch.equal(y, want), shape
        y = x.clone()
        got = ref_rope(y, angles, inverse=inverse, inplace=True)
        assert got is y and torch.equal(got, ref_rope(x, angles, inverse=inverse))
buf = torch.randn(3, 4, 80, generator=g)
angles = torch.rand(3, 32, generator=g) * 100
view, before = buf[..., 8:72], buf.clone()
want = rope_interleaved(view, angles)
assert rope_interleaved(view, angles, inplace=True) is view
assert torch.equal(view, want) and torch.equal(buf[..., :8], before[..., :8])
assert torch.equal(buf[..., 72:], before[..., 72:])
t = torch.randn(3, 2, 4, 64, generator=g).transpose(1, 2)  # rows not addressable as [3, 8, 64]
want = rope_interleaved(t, angles)
assert rope_interleaved(t, angles, inplace=True) is t and torch.equal(t, want)

# RMSNorm + RoPE in one pass: the values of norm.py's kernel then the rope kernel, close to the reference
for (n, d, pairs), dtype in zip([(3, 64, 32), (5, 128, 32), (1, 24, 4), (2, 20, 10)],
                                [torch.float32, torch.bfloat16, torch.float32, torch.bfloat16]):
    x = (torch.randn(n, d + 8, generator=g) * 3)[:, :d].to(dtype)  # rows of a wider buffer
    w = torch.rand(d, generator=g).to(dtype) + 0.5
    angles = torch.rand(n, pairs, generator=g) * torch.logspace(6, -4, pairs)
    got = rms_norm_rope(x, w, 1e-6, angles)
    assert got.dtype == dtype and got.shape == (n, d)
    assert torch.equal(got, rope_interleaved(rms_norm(x, w, 1e-6), angles)), (n, d)
    want = ref_norm_rope(x, w, 1e-6, angles)
    tol = 1e-5 if dtype == torch.float32 else 2**-6  # the interpreter's bf16 cast truncates
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
assert rms_norm_rope(x[:0], w, 1e-6, angles[:0]).shape == (0, d)
print("ok")
"""


def test_rope_matches_reference_in_the_interpreter(run_in_interpreter):
    run_in_interpreter(_SCRIPT)
