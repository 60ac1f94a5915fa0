"""Engram ops under Triton's CPU interpreter against the reference ops: hash rows identical (also with
wrapping int64 products and negative XORs), float32 gathers identical, gate within 1e-6 (float32 sums
in another order). bf16 outputs are checked on the GPU only: the interpreter's bf16 cast truncates.
The interpreter must be switched on before triton is imported, hence a subprocess."""

import pytest

pytestmark = pytest.mark.slow

_SCRIPT = r"""
import torch
from deepinfer.checkpoint.formats import quantize_fp8_rows
from deepinfer.config import engram_multipliers, engram_primes
from deepinfer.ops.reference import engram as ref
from deepinfer_kernels_cuda import engram as ker

g = torch.Generator().manual_seed(0)
n, heads, vocab = 4, 3, 1000
primes = torch.tensor(engram_primes([1], n, heads, 61)[0])
offsets = (primes.flatten().cumsum(0) - primes.flatten()).view_as(primes)
ngrams = torch.randint(0, vocab, (70, n), generator=g)  # 70 rows: two programs
wrapping = torch.tensor([2**62 + 1, 2**61 + 3, 2**60 + 5, 7])
for mult in (torch.tensor(engram_multipliers(1, n, vocab)), wrapping):
    want = ref.engram_hash(ngrams, mult, primes, offsets)
    assert torch.equal(ker.engram_hash(ngrams, mult, primes, offsets), want)
rows = ref.engram_hash(ngrams, mult, primes, offsets)
table, scale = quantize_fp8_rows(torch.randn(int(primes.sum()), 96, generator=g) * 3)
table.view(torch.uint8)[:3, :4] = torch.tensor([0x00, 0x80, 0x01, 0xFE], dtype=torch.uint8)  # ±0, tiny, max
assert torch.equal(ker.engram_lookup(table, scale, rows, torch.float32),
                   ref.engram_lookup(table, scale, rows, torch.float32))
t, m, h = 5, 4, 1100  # two chunks of 1024 channels
streams, weights = torch.randn(t, m, h, generator=g), torch.randn(m, h, generator=g)
keys, value = torch.randn(t, (m + 1) * h, generator=g).split((m * h, h), dim=-1)  # slices, as the model's
keys = keys.unflatten(-1, (m, h))
for mask in (None, torch.tensor([True, False, True, True, False])):
    got = ker.engram_gate(streams, keys, value, weights, mask, 1e-6)
    torch.testing.assert_close(got, ref.engram_gate(streams, keys, value, weights, mask, 1e-6), atol=1e-6,
                               rtol=1e-6)
print("ok")
"""


def test_engram_ops_match_reference_in_the_interpreter(run_in_interpreter):
    run_in_interpreter(_SCRIPT)
