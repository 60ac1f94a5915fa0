"""Exact verification: the emitted tokens have the target's distribution whatever the draft, greedy
keeps exactly the argmax prefix, and every draw is keyed by (seed, position) only."""

from __future__ import annotations

import torch

from deepinfer.sampling import SamplingParams
from deepinfer.sampling.sampler import Sampler, SampleRow, sampling_metadata
from deepinfer.speculators.verify import accept_drafts, sample_drafts, target_probs, verify

V = 6
N = 30_000
# chi-square critical values at p = 1e-4 by degrees of freedom
CRITICAL = {2: 18.4, 3: 21.1, 4: 23.5, 5: 25.7}


def chi_square(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=V).double()
    support = probs > 0
    assert counts[~support].sum() == 0, "a token outside the target's support was emitted"
    expected = probs[support] * len(tokens)
    return float(((counts[support] - expected) ** 2 / expected).sum())


def rows_for(params: SamplingParams, n: int, position: int = 17) -> list[SampleRow]:
    return [SampleRow(params, seed=1000 + i, position=position, num_outputs=5) for i in range(n)]


TARGET = torch.tensor([1.5, 0.2, -0.3, 1.0, -2.0, 0.4])
WRONG_DRAFT = torch.tensor([-1.0, 2.0, 0.5, -0.5, 1.0, -1.0])  # favours tokens the target does not


def target_distribution(params: SamplingParams) -> torch.Tensor:
    meta, _ = sampling_metadata(rows_for(params, 1), V, None, torch.device("cpu"))
    return target_probs(TARGET[None], meta)[0]


def test_acceptance_and_residual_give_the_target_distribution() -> None:
    q = torch.softmax(TARGET.double(), -1).expand(N, V)
    p = torch.softmax(WRONG_DRAFT.double(), -1).expand(N, V)
    g = torch.Generator().manual_seed(0)
    drafts = torch.multinomial(p, 1, generator=g)[:, 0]
    ok, corrected = accept_drafts(q, p, drafts, torch.rand(N, generator=g, dtype=torch.float64),
                                  torch.rand(N, generator=g, dtype=torch.float64))
    emitted = torch.where(ok, drafts, corrected)
    assert chi_square(emitted, q[0]) < CRITICAL[5]
    assert chi_square(drafts, q[0]) > 100 * CRITICAL[5]  # the test has power: the draft alone fails it
    # acceptance rate is sum_x min(p, q)
    expected_rate = torch.minimum(p[0], q[0]).sum().item()
    assert abs(ok.double().mean().item() - expected_rate) < 0.02


def test_verify_with_drawn_drafts_samples_the_filtered_target() -> None:
    params = SamplingParams(temperature=0.8, top_k=5, top_p=0.95, seed=3)
    rows = rows_for(params, N)
    drafts, probs = sample_drafts(WRONG_DRAFT.expand(N, V), rows, None)
    out = verify(TARGET.expand(N, V), rows, drafts.tolist(), probs, None)
    q = target_distribution(params)
    dof = int((q > 0).sum()) - 1
    assert chi_square(out.tokens, q) < CRITICAL[dof]
    draft_freq = torch.bincount(drafts, minlength=V).double() / N
    assert (draft_freq - q).abs().sum() > 0.5  # the drafts alone are far from the target


def test_verify_with_deterministic_drafts_samples_the_target() -> None:
    params = SamplingParams(temperature=1.0, seed=3)
    rows = rows_for(params, N)
    drafts = [1] * N  # a one-hot draft the target gives ~12%
    out = verify(TARGET.expand(N, V), rows, drafts, None, None)
    q = target_distribution(params)
    assert chi_square(out.tokens, q) < CRITICAL[5]
    assert abs(out.accepted.double().mean().item() - q[1].item()) < 0.01  # P(accept) = q(d)


def test_greedy_keeps_the_argmax_prefix_and_corrects_the_first_miss() -> None:
    logits = torch.randn(5, V, generator=torch.Generator().manual_seed(1))
    best = logits.argmax(-1).tolist()
    params = SamplingParams(temperature=0)
    rows = [SampleRow(params, 0, 10 + j, j) for j in range(5)]
    drafts = [best[0], best[1], (best[2] + 1) % V, best[3], -1]
    # draft distributions that disagree with the target do not matter for greedy
    probs = torch.softmax(-logits[:4], -1)
    out = verify(logits, rows, drafts, probs, None)
    assert out.accepted.tolist() == [True, True, False, True, False]
    assert out.tokens.tolist() == best


def test_draftless_rows_sample_exactly_like_the_sampler() -> None:
    params = SamplingParams(temperature=0.9, top_p=0.8, presence_penalty=0.5, logprobs=2)
    rows = [SampleRow(params, 77 + i, 30 + i, 3, prompt_ids=[1, 2], output_ids=[3, 3, 4]) for i in range(64)]
    logits = torch.randn(64, V, generator=torch.Generator().manual_seed(2))
    plain = Sampler(None)(logits, rows)
    out = verify(logits, rows, [-1] * 64, None, None)
    assert out.tokens.tolist() == plain.token_ids
    assert [lp.logprob for lp in out.logprobs.get()] == [lp.logprob for lp in plain.logprobs]


def test_min_tokens_ban_rejects_an_early_eos_draft() -> None:
    eos = 0
    params = SamplingParams(temperature=0, min_tokens=4)
    logits = torch.zeros(2, V)
    logits[:, eos] = 5.0
    rows = [SampleRow(params, 0, 20, 2), SampleRow(params, 0, 21, 3)]
    out = verify(logits, rows, [eos, -1], None, eos)
    assert out.accepted.tolist() == [False, False]
    assert out.tokens[0].item() != eos


def test_draws_depend_only_on_seed_and_position() -> None:
    params = SamplingParams(temperature=1.0)
    rows = [SampleRow(params, 5, 40, 0), SampleRow(params, 9, 41, 0), SampleRow(params, 5, 42, 0)]
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(3))
    full = verify(logits, rows, [2, 3, -1], None, None)
    alone = [verify(logits[i:i + 1], rows[i:i + 1], [[2, 3, -1][i]], None, None) for i in range(3)]
    assert full.tokens.tolist() == [a.tokens.item() for a in alone]
    assert full.accepted.tolist() == [a.accepted.item() for a in alone]


def test_mixed_greedy_and_drawn_rows_verify_as_alone() -> None:
    """Greedy rows (argmax shortcut) beside drawn rows with draft distributions: each row's result is
    the one it gets verified alone (the drawn rows' distributions stay paired with their drafts)."""
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(6, V, generator=g)
    greedy, drawn = SamplingParams(temperature=0), SamplingParams(temperature=1.0)
    kinds = [greedy, drawn, greedy, drawn, drawn, greedy]
    rows = [SampleRow(p, 11 + i, 50 + i, 0) for i, p in enumerate(kinds)]
    drafts = [logits[0].argmax().item(), 2, 1, 4, -1, 3]
    probs = torch.softmax(torch.randn(5, V, generator=g), -1)  # one per drafted row, in order
    full = verify(logits, rows, drafts, probs, None)
    prob_of = dict(zip([i for i, d in enumerate(drafts) if d >= 0], probs, strict=True))
    for i in range(6):
        alone = verify(logits[i:i + 1], rows[i:i + 1], drafts[i:i + 1],
                       prob_of[i][None] if i in prob_of else None, None)
        assert full.tokens[i] == alone.tokens[0] and full.accepted[i] == alone.accepted[0]
    assert full.accepted[0] and full.tokens[2] == logits[2].argmax()


def test_plain_greedy_rows_share_cached_metadata() -> None:
    from deepinfer.speculators.verify import row_metadata

    cpu = torch.device("cpu")
    greedy = SamplingParams(temperature=0, top_p=0.5)  # filters apply to drawn rows only
    rows = [SampleRow(greedy, 7 + i, 30 + i, 2) for i in range(4)]
    cached, _ = row_metadata(rows, V, 0, cpu)
    assert row_metadata([SampleRow(greedy, 1, 3, 9)] * 4, V, 0, cpu)[0] is cached
    built, _ = sampling_metadata(rows, V, 0, cpu)
    for name in ("greedy", "temperature", "top_k", "bias_rows", "ban_rows", "output_rows", "seen_rows"):
        assert torch.equal(getattr(cached, name), getattr(built, name)), name
    assert (cached.any_drawn, cached.any_adjusted) == (built.any_drawn, built.any_adjusted) == (False, False)
    banned = [SampleRow(SamplingParams(temperature=0, min_tokens=5), 0, 30, 2)] * 4  # EOS still banned
    assert row_metadata(banned, V, 0, cpu)[0].any_adjusted
