"""Engram ops on the GPU against the reference ops on the GPU, for 1 / 64 / 2048 rows at Flash-like widths
(hidden 4096, 4 streams, 16 table heads x 128): hash rows and gathered values identical (float32 and
bf16), gate outputs within float32 rounding of the gate (fp32: 1e-5; bf16: one bf16 ulp where the
gate's last bits move a rounding). A row alone equals the row in a batch (row-wise)."""

import pytest
import torch

from deepinfer.checkpoint.formats import quantize_fp8_rows
from deepinfer.config import engram_multipliers, engram_primes
from deepinfer.ops.reference import engram as ref
from deepinfer_kernels_cuda import engram as ker

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

N, HEADS, VOCAB, D, M, H = 3, 8, 129280, 128, 4, 4096


def _tables(seed: int):
    primes = torch.tensor(engram_primes([2], N, HEADS, 5000)[0])
    offsets = (primes.flatten().cumsum(0) - primes.flatten()).view_as(primes)
    mult = torch.tensor(engram_multipliers(2, N, VOCAB))
    g = torch.Generator().manual_seed(seed)
    table, scale = quantize_fp8_rows(torch.randn(int(primes.sum()), D, generator=g))
    return [t.cuda() for t in (mult, primes, offsets, table, scale)]


@pytest.mark.parametrize("rows", [1, 64, 2048])
def test_hash_and_lookup_match_reference(rows):
    mult, primes, offsets, table, scale = _tables(rows)
    ngrams = torch.randint(0, VOCAB, (rows, N), generator=torch.Generator().manual_seed(rows)).cuda()
    hashed = ker.engram_hash(ngrams, mult, primes, offsets)
    assert torch.equal(hashed, ref.engram_hash(ngrams, mult, primes, offsets))
    for dtype in (torch.float32, torch.bfloat16):
        assert torch.equal(ker.engram_lookup(table, scale, hashed, dtype),
                           ref.engram_lookup(table, scale, hashed, dtype))


@pytest.mark.parametrize("rows", [1, 64, 2048])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gate_matches_reference(rows, dtype):
    g = torch.Generator().manual_seed(rows)
    streams, keys = (torch.randn(rows, M, H, generator=g).to(dtype).cuda() for _ in range(2))
    value = torch.randn(rows, H, generator=g).to(dtype).cuda()
    weights = torch.randn(M, H, generator=g).cuda()
    mask = (torch.arange(rows) % 3 != 1).cuda()
    got = ker.engram_gate(streams, keys, value, weights, mask, 1e-6)
    want = ref.engram_gate(streams, keys, value, weights, mask, 1e-6)
    tol = (1e-5, 1e-5) if dtype == torch.float32 else (1e-5, 2**-7)
    torch.testing.assert_close(got.float(), want.float(), atol=tol[0], rtol=tol[1])
    alone = ker.engram_gate(streams[-1:], keys[-1:], value[-1:], weights, mask[-1:], 1e-6)
    assert torch.equal(alone[0], got[-1])
