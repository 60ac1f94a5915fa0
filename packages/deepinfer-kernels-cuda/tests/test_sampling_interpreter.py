"""The sampling kernels under Triton's CPU interpreter against the reference ops, on small vocabularies
with tiny blocks and slices (so every row spans several slices): uniforms bitwise, penalties and bitmask
bitwise, sampled tokens equal (greedy, filtered, tied and drawn rows).
The interpreter must be switched on before triton is imported, hence a subprocess."""

import pytest

pytestmark = pytest.mark.slow

_SCRIPT = r"""
import torch
from deepinfer.ops.reference import sampling as ref
from deepinfer.sampling import SampleRow, SamplingParams, rng
from deepinfer.sampling.sampler import sampling_metadata
from deepinfer.testing.conformance.sampling import EOS, VOCAB, _adjusted, random_batch
from deepinfer_kernels_cuda import sampling as ker

ker._BLOCK, ker._SLICE = 64, 320  # VOCAB 600 -> 2 slices of 320, 5 blocks each
cpu = torch.device("cpu")

# uniforms: bit-identical to rng.uniform, all purposes, extreme seeds and positions
seeds = torch.tensor([rng.as_int64(s) for s in (0, 1, 2**63 - 1, 2**63, 2**64 - 1, 0x9E3779B97F4A7C15)])
positions = torch.tensor([0, 1, 2**31 - 1, 2**31, 2**40 + 3, 7])
for purpose in (rng.PURPOSE_SAMPLE, rng.PURPOSE_DRAFT, rng.PURPOSE_ACCEPT, rng.PURPOSE_RESIDUAL):
    want = rng.uniform(seeds, positions, purpose)
    assert torch.equal(ker.uniform(seeds, positions, purpose), want), purpose

# mixed random batches (bias, bans, penalties, greedy, top-k/p, min-p, -inf and tied logits)
logits, rows = random_batch(22, 7)
meta, _ = sampling_metadata(rows, VOCAB, EOS, cpu)
assert torch.equal(ker.apply_penalties(logits, meta), ref.apply_penalties(logits, meta))
x = _adjusted(logits, rows)
assert torch.equal(ker.sample_tokens(x, meta), ref.sample_tokens(x, meta))

# ties across the top-k / top-p cut and min-p at a tie: few distinct logits, index order decides
g = torch.Generator().manual_seed(5)
tied = torch.randint(0, 5, (6, VOCAB), generator=g).float()
params = [SamplingParams(temperature=1.0, top_k=k, top_p=p, min_p=mp)
          for k, p, mp in ((3, 1.0, 0.0), (150, 1.0, 0.0), (-1, 0.3, 0.0), (40, 0.45, 0.0), (-1, 1.0, 0.3),
                           (400, 0.8, 0.05))]
rows = [SampleRow(p, rng.as_int64(1000 + i), i, 0) for i, p in enumerate(params)]
meta, _ = sampling_metadata(rows, VOCAB, EOS, cpu)
assert torch.equal(ker.sample_tokens(tied, meta), ref.sample_tokens(tied, meta))

# penalties with repeated generated tokens and every stage on one row
rows = [SampleRow(SamplingParams(temperature=1.0, presence_penalty=0.5, frequency_penalty=0.3,
                                 repetition_penalty=1.3, logit_bias={3: 2.0, 9: -1.5}, min_tokens=4,
                                 stop_token_ids=[3]), rng.as_int64(9), 0, 2, [4, 5, 9], [5, 5, 9, 5])]
meta, _ = sampling_metadata(rows, VOCAB, EOS, cpu)
x = torch.randn(1, VOCAB, generator=g)
assert torch.equal(ker.apply_penalties(x, meta), ref.apply_penalties(x, meta))
plain, _ = sampling_metadata([SampleRow(SamplingParams(), 0, 0, 0)], VOCAB, EOS, cpu)
assert ker.apply_penalties(x, plain) is x  # nothing applies: no copy

# bitmask: bitwise, -0.0 and +inf included (the reference adds 0 / -inf)
for vocab in (70, 257, 1000):
    x = torch.randn(3, vocab, generator=g)
    x[0, 0], x[1, 1] = -0.0, float("inf")
    words = torch.randint(-(2**31), 2**31, (3, -(-vocab // 32)), generator=g, dtype=torch.int64).int()
    words[2] = -1
    got, want = ker.apply_token_bitmask(x, words), ref.apply_token_bitmask(x, words)
    torch.testing.assert_close(got, want, atol=0, rtol=0, equal_nan=True)
    assert torch.equal(got.signbit(), want.signbit())

try:
    ker.sample_tokens(torch.zeros(2, 3, dtype=torch.float64), meta)
    raise SystemExit("float64 logits accepted")
except ValueError as e:
    assert "float32" in str(e)
print("ok")
"""


def test_sampling_kernels_match_reference_in_the_interpreter(run_in_interpreter):
    run_in_interpreter(_SCRIPT, timeout=900)
