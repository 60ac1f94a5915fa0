"""The sampling kernels on the GPU at the V4 vocabulary (129280) against the reference ops on the same
device: greedy tokens, uniforms, penalties and bitmask bitwise; drawn tokens equal except at float32
boundaries (mismatch rate measured and bounded, every mismatch still a token the filters keep);
the draw's distribution (chi-square); batch invariance; no host syncs."""

from __future__ import annotations

import math
import random

import pytest
import torch

from deepinfer.ops.reference import sampling as ref
from deepinfer.sampling import SampleRow, SamplingParams, rng
from deepinfer.sampling.sampler import sampling_metadata

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

V, EOS = 129280, 1
CUDA = torch.device("cuda")


@pytest.fixture(scope="module")
def ker():
    from deepinfer_kernels_cuda import sampling

    return sampling


def llm_logits(rows: int, seed: int) -> torch.Tensor:
    """Logits shaped like a language model's: a heavy tail plus a few strong candidates per row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, V, generator=g) * 2.0
    top = torch.randint(0, V, (rows, 20), generator=g)
    x.scatter_(1, top, torch.randn(rows, 20, generator=g) * 3 + 12)
    return x.to(CUDA)


def mixed_rows(n: int, seed: int, position: int = 0) -> list[SampleRow]:
    r = random.Random(seed)
    rows = []
    for _ in range(n):
        kw: dict = {"temperature": r.choice([0.0, 0.6, 1.0, 1.0, 1.3])}
        kw["top_k"] = r.choice([-1, -1, 1, 20, 50, 1000])
        kw["top_p"] = r.choice([1.0, 1.0, 0.5, 0.9, 0.95])
        kw["min_p"] = r.choice([0.0, 0.0, 0.05])
        seed = rng.as_int64(r.getrandbits(64))
        rows.append(SampleRow(SamplingParams(**kw), seed, position + r.randrange(1000), 0))
    return rows


def kept_float64(x: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """[V] bool: tokens the reference's filters keep, decided in float64 with slack at the cuts."""
    probs = torch.softmax(x.double() / p.temperature, -1)
    sorted_p, order = probs.sort(descending=True, stable=True)
    keep = torch.ones_like(sorted_p, dtype=torch.bool)
    if p.top_k > 0:
        keep[p.top_k:] = False
    keep &= (sorted_p.cumsum(0) - sorted_p) < p.top_p + 1e-6
    keep &= sorted_p >= p.min_p * sorted_p[0] - 1e-6
    return torch.zeros_like(keep).scatter_(0, order, keep) & (probs > 0)


@pytest.mark.parametrize("batch", [1, 8, 64, 256])
def test_tokens_match_the_reference(ker, batch):
    x = llm_logits(batch, batch)
    rows = mixed_rows(batch, batch)
    meta, _ = sampling_metadata(rows, V, EOS, CUDA)
    got, want = ker.sample_tokens(x, meta), ref.sample_tokens(x, meta)
    greedy = meta.greedy
    assert torch.equal(got[greedy], want[greedy]) and torch.equal(got[greedy], x[greedy].argmax(-1))
    differ = (got != want).nonzero()[:, 0].tolist()
    print(f"\nbatch {batch}: {len(differ)} of {batch} tokens differ from the reference")
    for i in differ:
        assert bool(kept_float64(x[i], rows[i].params)[got[i]]), f"row {i}: token {int(got[i])} not kept"
    assert len(differ) <= max(1, batch // 100), f"{len(differ)} of {batch} rows differ"


def test_greedy_only_batches_are_argmax(ker):
    x = llm_logits(64, 3)
    x[5, 100:110] = x[5].max() + 1  # ties: the first index wins
    x[6] = float("-inf")
    rows = [SampleRow(SamplingParams(temperature=0.0), 0, 0, 0) for _ in range(64)]
    meta, _ = sampling_metadata(rows, V, EOS, CUDA)
    assert torch.equal(ker.sample_tokens(x, meta), x.argmax(-1))


def test_mismatch_rate_over_many_seeds(ker):
    """5120 drawn rows (filtered and not) at V=129280: rate of tokens differing from the reference."""
    x = llm_logits(256, 7)
    mismatches, total = 0, 0
    for step in range(20):
        rows = mixed_rows(256, 100 + step, step * 1000)
        for r in rows:
            r.params = r.params.model_copy(update={"temperature": r.params.temperature or 1.0})
        meta, _ = sampling_metadata(rows, V, EOS, CUDA)
        mismatches += int((ker.sample_tokens(x, meta) != ref.sample_tokens(x, meta)).sum())
        total += 256
    print(f"\nsample_tokens vs reference: {mismatches} of {total} drawn rows differ")
    assert mismatches / total < 1e-3


def test_uniforms_bitwise(ker):
    g = torch.Generator().manual_seed(0)
    seeds = torch.randint(-(2**63), 2**63 - 1, (1 << 20,), generator=g, dtype=torch.int64).to(CUDA)
    positions = torch.randint(0, 1 << 40, (1 << 20,), generator=g, dtype=torch.int64).to(CUDA)
    for purpose in (rng.PURPOSE_SAMPLE, rng.PURPOSE_RESIDUAL):
        assert torch.equal(ker.uniform(seeds, positions, purpose), rng.uniform(seeds, positions, purpose))


def test_draw_distribution_chi_square(ker):
    """8192 draws over 16 finite tokens of a V=129280 row (temperature 0.8, top-k 12, top-p 0.97):
    histogram vs the kept, renormalised float64 distribution."""
    n = 8192
    small = torch.linspace(-3, 2, 16)[torch.randperm(16, generator=torch.Generator().manual_seed(1))]
    where = torch.arange(16) * 8000 + 5  # spread over the row's slices
    logits = torch.full((V,), float("-inf"))
    logits[where] = small
    params = SamplingParams(temperature=0.8, top_k=12, top_p=0.97)
    rows = [SampleRow(params, rng.as_int64(77), i, 0) for i in range(n)]
    meta, _ = sampling_metadata(rows, V, EOS, CUDA)
    tokens = ker.sample_tokens(logits.to(CUDA).expand(n, V).contiguous(), meta).cpu()
    assert torch.isin(tokens, where).all(), "a token of probability 0 was drawn"
    keep = kept_float64(small, params)
    probs = torch.softmax(small.double() / 0.8, -1) * keep
    expected = probs / probs.sum() * n
    counts = torch.bincount(torch.searchsorted(where, tokens), minlength=16).double()
    assert counts[~keep].sum() == 0, "a filtered token was drawn"
    chi2 = float(((counts - expected)[keep] ** 2 / expected[keep]).sum())
    df = int(keep.sum()) - 1
    critical = df * (1 - 2 / (9 * df) + 3.72 * math.sqrt(2 / (9 * df))) ** 3  # p = 1e-4 (Wilson-Hilferty)
    print(f"\nchi-square {chi2:.1f} on {df} degrees of freedom (critical {critical:.1f})")
    assert chi2 < critical, (chi2, critical)


def test_rows_do_not_depend_on_the_batch(ker):
    x = llm_logits(64, 11)
    rows = mixed_rows(64, 11)
    meta, _ = sampling_metadata(rows, V, EOS, CUDA)
    batch = ker.sample_tokens(x, meta)
    for i in range(0, 64, 9):
        alone, _ = sampling_metadata([rows[i]], V, EOS, CUDA)
        assert int(ker.sample_tokens(x[i : i + 1].clone(), alone)[0]) == int(batch[i]), i


def penalty_rows(n: int, seed: int) -> list[SampleRow]:
    r = random.Random(seed)
    rows = []
    for _ in range(n):
        bias = {r.randrange(V): r.uniform(-50, 50) for _ in range(r.randint(0, 5))}
        params = SamplingParams(temperature=1.0, presence_penalty=r.choice([0.0, 0.5, -1.0]),
                                frequency_penalty=r.choice([0.0, 0.3, 1.5]),
                                repetition_penalty=r.choice([1.0, 1.2, 3.0]), logit_bias=bias,
                                min_tokens=r.choice([0, 10]), stop_token_ids=[r.randrange(V)])
        out = [r.randrange(300) for _ in range(r.randint(1, 200))]  # repeats: frequency counts > 1
        rows.append(SampleRow(params, 0, 0, r.randrange(20), [r.randrange(V) for _ in range(500)], out))
    return rows


@pytest.mark.parametrize("batch", [1, 64])
def test_penalties_bitwise(ker, batch):
    x = llm_logits(batch, 20 + batch)
    meta, _ = sampling_metadata(penalty_rows(batch, batch), V, EOS, CUDA)
    assert meta.any_adjusted
    torch.testing.assert_close(ker.apply_penalties(x, meta), ref.apply_penalties(x, meta), atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bitmask_bitwise(ker, dtype):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(64, V, generator=g).to(CUDA, dtype)
    x[0, :4] = torch.tensor([-0.0, float("inf"), float("-inf"), 0.0])
    words = torch.randint(-(2**31), 2**31, (64, -(-V // 32)), generator=g, dtype=torch.int64).to(torch.int32)
    words[1] = -1
    got, want = ker.apply_token_bitmask(x, words.to(CUDA)), ref.apply_token_bitmask(x, words.to(CUDA))
    torch.testing.assert_close(got, want, atol=0, rtol=0, equal_nan=True)
    assert torch.equal(got.signbit(), want.signbit())


def test_no_host_sync(ker):
    x = llm_logits(8, 40)
    rows = penalty_rows(8, 41)
    for r in rows:
        r.params = r.params.model_copy(update={"top_k": 50, "top_p": 0.9})
    meta, _ = sampling_metadata(rows, V, EOS, CUDA)
    words = torch.full((8, -(-V // 32)), -1, dtype=torch.int32, device=CUDA)

    def step() -> None:
        ker.sample_tokens(ker.apply_penalties(ker.apply_token_bitmask(x, words), meta), meta)

    step()  # compile outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
