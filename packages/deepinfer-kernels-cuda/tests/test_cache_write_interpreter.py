"""`cache_write` (and the row scatter under it) under Triton's CPU interpreter against the reference op:
stored bytes identical for every codec, ragged row counts across program tiles, padding rows, block
boundaries, a strided region, gathered source rows and identity destinations. The interpreter must be
switched on before triton is imported, hence a subprocess. Float32 values stored as raw bf16 are checked on
the GPU only: the interpreter's bf16 cast truncates, the device rounds to nearest even as torch does."""

import pytest
import torch

from deepinfer.cache import Codec
from deepinfer_kernels_cuda.cache_quant import cache_write

pytestmark = pytest.mark.slow

_SCRIPT = r"""
import torch
from deepinfer.cache import Codec
from deepinfer.ops.reference.cache_quant import cache_write as ref_write
from deepinfer_kernels_cuda.cache_quant import cache_write, write_rows

g = torch.Generator().manual_seed(0)
A, E = 12, 4

def values(n, d, dtype):
    # ~28 binades, plus zero, negative-zero, tiny and exact-code groups
    x = torch.randn(n, d, generator=g) * torch.exp2(torch.randint(-20, 8, (n, d), generator=g).float())
    x[0, :32] = 0
    x[-1, :16] = -0.0
    x[n // 2, :16] = 1e-30
    x[-1, 32:64] = torch.tensor([0.25, 0.75, 1.75, 3.5, 5.0, 6.0, -448.0, 448.0] * 4)
    return x.to(dtype)

def region(codec):
    # a strided view: each entry padded by 16 bytes, as a region of a wider slot would be
    return torch.full((A, E, codec.nbytes + 16), 7, dtype=torch.uint8)[:, :, : codec.nbytes]

codecs = [(Codec("raw", 64, torch.float32), torch.bfloat16), (Codec("raw", 64, torch.bfloat16),
                                                             torch.bfloat16)]
codecs += [(Codec(f, d, torch.bfloat16), dt) for f in ("fp8", "nvfp4", "mxfp4") for d in (64, 96)
           for dt in (torch.float32, torch.bfloat16)]
for codec, dtype in codecs:
    for n in (1, 5, 40):  # 96-wide rows: tiles of 32 rows x 128 columns, 40 rows span two
        x = values(n, codec.dim, dtype)
        dest = torch.randperm(A * E - 2, generator=g)[:n] + 1
        dest[dest >= 2 * E - 1] += 1
        dest[-1] = 2 * E - 1  # the last entry of a block
        dest[: n // 3] = 0  # padding rows: block 0, entry 0, identical values
        x[: n // 3] = x[0]
        got, want = region(codec), region(codec)
        cache_write(got, dest, x, codec)
        ref_write(want, dest, x, codec)
        assert torch.equal(got, want), (codec, dtype, n, (got != want).nonzero()[:4])

codec = Codec("raw", 64, torch.float32)
x, src = torch.randn(9, 64, generator=g), torch.tensor([8, 0, 3])
dest = torch.tensor([5, 17, 2])
got, want = region(codec), region(codec)
write_rows(got, dest, x, codec, src=src)
ref_write(want, dest, x[src], codec)
assert torch.equal(got, want)

# no dest: row i to flat row i (the attention's encoding of a step's keys)
for codec in (Codec("fp8", 64, torch.bfloat16), Codec("nvfp4", 64, torch.bfloat16)):
    x = values(7, 64, torch.bfloat16)
    got, want = region(codec), region(codec)
    write_rows(got, None, x, codec)
    ref_write(want, torch.arange(7), x, codec)
    assert torch.equal(got, want), codec
print("ok")
"""


def test_cache_write_matches_reference_in_the_interpreter(run_in_interpreter):
    run_in_interpreter(_SCRIPT)


_FP8 = Codec("fp8", 64, torch.bfloat16)  # 66 bytes per entry


@pytest.mark.parametrize(
    ("pool_bytes", "rows", "width", "n_dest", "match"),
    [(64, 3, 64, 3, "uint8 \\[A, E, 66\\]"), (66, 3, 48, 3, "must be \\[n, 64\\]"),
     (66, 3, 64, 2, "dest has shape \\(2,\\), expected \\(3,\\)")],
)
def test_bad_shapes_are_named(pool_bytes, rows, width, n_dest, match):
    pool = torch.zeros(2, 4, pool_bytes, dtype=torch.uint8)
    with pytest.raises(ValueError, match=match):
        cache_write(pool, torch.zeros(n_dest, dtype=torch.long), torch.zeros(rows, width), _FP8)
