"""mHC coefficients under Triton's CPU interpreter against the reference op (float32 streams: the
interpreter's bf16 cast and dot are wrong, so the bf16 path is checked on the GPU only): row counts that
take one or several row blocks and projection chunks (a ragged last chunk), default and invariant mode;
in invariant mode a row's coefficients bitwise the same alone and in a batch of 70. T = 1 and 20 take the
latency path, T = 70 and invariant mode the rows path."""

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
alone = ker.hc_coefficients(streams[:1], *args[1:], batch_invariant=True)
for a, b in zip(alone, got, strict=True):
    assert torch.equal(a, b[:1])
print("ok")
"""


@pytest.mark.slow
def test_hc_coefficients_match_reference_in_the_interpreter(run_in_interpreter):
    run_in_interpreter(_SCRIPT)
