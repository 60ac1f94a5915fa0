"""`cache_write` on the GPU: the stored bytes equal the reference op's (run on the CPU, the oracle; see
test_cache_quant_cuda.py) for every codec at the model's entry widths (512 KV, 128 index keys), both
input dtypes, 1 / 64 / 2048 new rows with padding rows and block-boundary destinations; a call
captured in a CUDA graph (no host syncs) replays with new values."""

import pytest
import torch

from deepinfer.cache import Codec
from deepinfer.ops.reference.cache_quant import cache_write as ref_write
from deepinfer_kernels_cuda.cache_quant import cache_write

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

E = 64  # entries per block (ratio 2)
CODECS = [Codec(fmt, dim, dtype) for fmt, dim, dtype in (
    ("raw", 512, torch.float32), ("raw", 512, torch.bfloat16), ("fp8", 512, torch.bfloat16),
    ("nvfp4", 512, torch.bfloat16), ("mxfp4", 128, torch.bfloat16))]


def _case(codec: Codec, n: int, dtype: torch.dtype, seed: int):
    """(region [A, E, nbytes] uint8 strided view, dest [n], values [n, dim]) on the CPU. The first n / 4
    rows are padding rows (block 0, entry 0, the same values), the last ones write the last entry of
    block 1 and the first of block 2; the others distinct random entries."""
    g = torch.Generator().manual_seed(seed)
    blocks, pad = n // E + 3, n // 4
    binades = torch.randint(-20, 8, (n, codec.dim), generator=g)
    x = torch.randn(n, codec.dim, generator=g) * torch.exp2(binades)
    x[:pad] = x[0]
    edge = torch.tensor([2 * E - 1, 2 * E])[: n - pad]
    others = torch.arange(E, blocks * E)
    others = others[(others != 2 * E - 1) & (others != 2 * E)]
    others = others[torch.randperm(len(others), generator=g)[: n - pad - len(edge)]]
    dest = torch.cat((torch.zeros(pad, dtype=torch.long), others, edge))
    region = torch.full((blocks, E, codec.nbytes + 32), 0x5A, dtype=torch.uint8)[:, :, : codec.nbytes]
    return region, dest, x.to(dtype)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: f"{c.format}-{c.dim}-{str(c.dtype)[6:]}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 64, 2048])
def test_bytes_match_reference(codec, dtype, n):
    region, dest, x = _case(codec, n, dtype, seed=n)
    want = region.clone()
    ref_write(want, dest, x, codec)
    got = region.cuda()
    cache_write(got, dest.cuda(), x.cuda(), codec)
    assert torch.equal(got.cpu(), want)


def test_captured_in_a_cuda_graph():
    codec = CODECS[3]
    region, dest, x = _case(codec, 64, torch.bfloat16, seed=1)
    dest, x = dest.cuda(), x.cuda()
    pool = region.cuda()
    cache_write(pool, dest, x, codec)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cache_write(pool, dest, x, codec)
    fresh = torch.randn_like(x)
    fresh[: len(x) // 4] = fresh[0]  # the padding rows share one destination: they keep one value
    x.copy_(fresh)
    graph.replay()
    want = region.clone()
    ref_write(want, dest.cpu(), x.cpu(), codec)
    assert torch.equal(pool.cpu(), want)
