"""`compressor_update` under Triton's CPU interpreter against the reference op: groups mixing ring rows
and step rows, ring rows the same step overwrites (read before the update), padding groups, ratios 2
and 3, widths across channel tiles, group counts across program tiles. The ring bytes must be
identical; pooled values agree to 1e-6 (the interpreter's exp is numpy's, the reference's torch's:
the last bit of a softmax weight may differ). The interpreter must be switched on before triton is
imported, hence a subprocess."""

import pytest

pytestmark = pytest.mark.slow

_SCRIPT = r"""
import torch
from deepinfer.ops.reference.attention import compressor_update as reference
from deepinfer_kernels_cuda.compressor import compressor_update

g = torch.Generator().manual_seed(0)
S, LC = 3, 5
for ratio, d, groups in ((2, 64, 3), (2, 160, 9), (3, 96, 6)):  # 160: two channel tiles; 9: three programs
    t = 2 * groups
    state = (torch.randn(S, LC, 2 * d, generator=g) * 3).view(torch.uint8)
    gate_value = torch.randn(t, 2 * d, generator=g) * 3
    sources = torch.randint(0, S * LC + t, (groups, ratio), generator=g)
    sources[0] = S * LC  # a padding group: step row 0 throughout
    sources[1, 0] = 2  # ring row 2, overwritten below after the read
    dest, src = torch.tensor([2, 9, 14, 7]), torch.tensor([t - 1, 0, 3, 1])
    got_state, want_state = state.clone(), state.clone()
    got = compressor_update(gate_value, got_state, sources, dest, src)
    want = reference(gate_value, want_state, sources, dest, src)
    assert torch.equal(got_state, want_state), (ratio, d, groups)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
print("ok")
"""


def test_compressor_update_matches_reference_in_the_interpreter(run_in_interpreter):
    run_in_interpreter(_SCRIPT)
