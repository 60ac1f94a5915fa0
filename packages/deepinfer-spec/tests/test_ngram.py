"""Prompt-lookup speculation: the matching rule, incremental indexing and the proposer contract."""

import random

import pytest
import torch

from deepinfer.sampling.params import SamplingParams
from deepinfer.speculators.interface import ProposeBatch, ProposeRequest, SpeculatorConfig
from deepinfer_spec.ngram import NgramIndex, NgramProposer


def _index(tokens, min_n=1, max_n=4) -> NgramIndex:
    index = NgramIndex(min_n, max_n)
    index.extend(tokens)
    return index


def _rescan(tokens, k, min_n, max_n):
    """The rule by exhaustive backward scan: longest suffix first, then its latest earlier occurrence."""
    for n in range(min(max_n, len(tokens)), min_n - 1, -1):
        suffix = tokens[len(tokens) - n :]
        for end in range(len(tokens) - 2, n - 2, -1):
            if tokens[end - n + 1 : end + 1] == suffix:
                return tokens[end + 1 : end + 1 + k], n
    return [], 0


def test_proposes_what_followed_the_suffix():
    assert _index([1, 2, 3, 4, 1, 2, 3]).propose(2) == ([4, 1], 3)


def test_no_match_no_proposal():
    assert _index([1, 2, 3]).propose(5) == ([], 0)
    assert _index([]).propose(5) == ([], 0)
    assert _index([7]).propose(5) == ([], 0)


def test_truncates_to_k_and_to_the_history():
    assert _index([1, 2, 3, 1]).propose(5) == ([2, 3, 1], 1)
    assert _index([1, 2, 3, 1]).propose(2) == ([2, 3], 1)


def test_prefers_the_longest_match():
    # "7" recurs most recently before "12", but "5 7" recurs (before "10 11").
    assert _index([5, 7, 10, 11, 3, 7, 12, 5, 7]).propose(2) == ([10, 11], 2)


def test_prefers_the_most_recent_occurrence():
    assert _index([1, 2, 8, 1, 2, 9, 1, 2]).propose(3) == ([9, 1, 2], 2)


def test_overlapping_repeats():
    assert _index([4, 4, 4, 4]).propose(3) == ([4], 3)


def test_min_n_excludes_short_matches():
    assert _index([1, 2, 3, 1], min_n=2).propose(3) == ([], 0)


@pytest.mark.parametrize("seed", range(6))
def test_incremental_index_equals_a_rescan(seed):
    rng = random.Random(seed)
    min_n, max_n = rng.choice([(1, 4), (2, 3), (1, 1)])
    tokens = [rng.randrange(4) for _ in range(200)]
    index = NgramIndex(min_n, max_n)
    done = 0
    while done < len(tokens):
        step = rng.choice([rng.randint(1, 7), rng.randint(16, 40)])  # a step's tokens, or a prompt
        index.extend(tokens[done : done + step])
        done = min(done + step, len(tokens))
        assert index.propose(5) == _rescan(tokens[:done], 5, min_n, max_n)


def test_bad_lengths_are_named():
    with pytest.raises(ValueError, match="min_n"):
        NgramIndex(0, 3)
    with pytest.raises(ValueError, match="min_n"):
        NgramIndex(3, 2)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        NgramProposer(0)


def _batch(*rows: tuple[int, list[int], int]) -> ProposeBatch:
    requests = [
        ProposeRequest(
            seq_id=seq_id,
            slot=seq_id,
            position=len(tokens) - 1,
            token_ids=tokens,
            params=SamplingParams(),
            seed=0,
            num_drafts=num_drafts,
        )
        for seq_id, tokens, num_drafts in rows
    ]
    return ProposeBatch(requests=requests, sampled=torch.tensor([tokens[-1] for _, tokens, _ in rows]))


def test_build_takes_k_from_the_config():
    assert NgramProposer.build(None, SpeculatorConfig(num_draft_tokens=3)).num_draft_tokens == 3
    assert NgramProposer.build(None, SpeculatorConfig(num_draft_tokens=None)).num_draft_tokens == 5


def test_proposal_rows_counts_and_caps():
    proposer = NgramProposer(4)
    proposal = proposer.propose(
        _batch((0, [1, 2, 3, 4, 5, 1, 2], 4), (1, [9, 8, 7], 4), (2, [6, 5, 4, 3, 6, 5], 2))
    )
    assert proposal.num_drafts == [4, 0, 2]
    assert proposal.probs is None
    assert proposal.token_ids.shape == (3, 4) and proposal.token_ids.dtype == torch.int64
    assert proposal.token_ids[0].tolist() == [3, 4, 5, 1]
    assert proposal.token_ids[2, :2].tolist() == [4, 3]
    assert proposal.confidences.shape == (3, 4)
    assert proposal.confidences[1].tolist() == [0.0] * 4  # nothing proposed, nothing to verify
    assert proposal.confidences[0].tolist() == [0.5] * 4  # the prior before any evidence


def test_confidences_learn_from_what_was_emitted():
    proposer = NgramProposer(3)
    history = [1, 2, 3, 4, 1, 2]
    assert proposer.propose(_batch((0, history, 3))).token_ids[0].tolist() == [3, 4, 1]  # from "1 2"
    # The target emitted 3, 4 (drafts 1 and 2 matched), then 9 (draft 3 missed); another sequence's
    # 2-gram match now carries the updated estimates (Beta(1, 1) prior + 1 observation each).
    proposal = proposer.propose(_batch((0, [*history, 3, 4, 9], 3), (1, [7, 8, 5, 7, 8], 3)))
    assert proposal.num_drafts == [0, 3]
    assert proposal.confidences[1].tolist() == pytest.approx([2 / 3, 2 / 3, 1 / 3])


def test_release_forgets_the_sequence():
    proposer = NgramProposer(2)
    proposer.propose(_batch((0, [1, 2, 1], 2)))
    proposer.release(0)
    proposer.release(0)  # idempotent
    # A new sequence under the same id starts from its own history.
    assert proposer.propose(_batch((0, [5, 6, 5], 2))).token_ids[0].tolist() == [6, 5]
