"""Prompt-lookup (n-gram) speculation: draft the tokens that followed the latest earlier occurrence of
the sequence's last n tokens, trying the longest n first. No model, no probabilities: drafts are
deterministic (one-hot), and exact verification keeps the output the target's whatever is proposed.

Each sequence keeps an index from n-gram to the end position of its latest occurrence that has a
following token; appending tokens only indexes the n-grams the new tokens complete, so a step costs
O(new tokens * n-gram lengths) however long the history is (memory: one int -> int dict entry per
token and n, about 100 bytes). An n-gram's key packs its token ids into one Python int (32 bits
each, one dict per n): exact, and cheaper than hashing tuples.

Acceptance estimates for confidence scheduling come from the drafts themselves: the tokens a
sequence emits next show which of its previous drafts matched the target's choice. With one-hot
drafts a draft is accepted exactly when the target's sample equals it, so a match is an unbiased
acceptance sample even for drafts the scheduler left unverified. Matches are counted per n-gram
length and draft position over all sequences.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from deepinfer.models.interface import CausalLM
from deepinfer.speculators.interface import Proposal, ProposeBatch, SpeculatorConfig
from deepinfer.speculators.registry import SpeculatorError

DEFAULT_NUM_DRAFTS = 5
DEFAULT_MIN_N = 1
DEFAULT_MAX_N = 4


def _check_lengths(min_n: int, max_n: int) -> None:
    if not 1 <= min_n <= max_n:
        raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")


KEY_BITS = 32  # token ids are packed into n-gram keys this wide: they must lie in [0, 2**32)
BULK = 16  # from this many new n-gram ends on, index with list comprehensions (a prompt)


class NgramIndex:
    """One token history and, for every n in [min_n, max_n], where each n-gram last occurred."""

    def __init__(self, min_n: int = DEFAULT_MIN_N, max_n: int = DEFAULT_MAX_N) -> None:
        _check_lengths(min_n, max_n)
        self.min_n = min_n
        self.max_n = max_n
        self.tokens: list[int] = []
        # per n: packed key of the n-gram (`_key`) -> end index of its latest occurrence with a
        # follower. Int keys also keep the dicts out of the garbage collector's traversals.
        self._latest_end: list[dict[int, int]] = [{} for _ in range(max_n + 1)]

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens; index the n-grams that now have a following token (those ending before the
        last token), later occurrences overwriting earlier ones."""
        history = self.tokens
        first = max(len(history) - 1, 0)  # the old last token gains a follower
        history.extend(tokens)
        last = len(history) - 2
        if last - first + 1 >= BULK:
            self._index_bulk(first, last)
            return
        latest, min_n, max_n = self._latest_end, self.min_n, self.max_n
        for end in range(first, last + 1):  # a step's few tokens: plain loops cost least
            key = 0
            for n in range(1, min(max_n, end + 1) + 1):
                key |= history[end - n + 1] << (KEY_BITS * (n - 1))
                if n >= min_n:
                    latest[n][key] = end

    def _index_bulk(self, first: int, last: int) -> None:
        """`extend` for n-grams ending at first..last, the same keys built a column at a time."""
        history = self.tokens
        keys, start = history[first : last + 1], first  # keys of the n-grams ending at start..last
        for n in range(1, self.max_n + 1):
            if n > 1:
                drop = max(0, n - 1 - start)  # ends with fewer than n tokens up to them
                keys, start = keys[drop:], start + drop
                shift = KEY_BITS * (n - 1)
                keys = [k | t << shift for k, t in zip(keys, history[start - n + 1 : last - n + 2])]
            if n >= self.min_n:
                self._latest_end[n].update(zip(keys, range(start, last + 1)))

    def propose(self, max_drafts: int) -> tuple[list[int], int]:
        """Up to `max_drafts` tokens that followed the latest earlier occurrence of the longest
        matching suffix, and that suffix's length n; ([], 0) when no suffix of length >= min_n recurs."""
        history = self.tokens
        keys, key = [0], 0  # keys[n]: the suffix of length n
        for n in range(1, min(self.max_n, len(history)) + 1):
            key |= history[-n] << (KEY_BITS * (n - 1))
            keys.append(key)
        for n in range(len(keys) - 1, self.min_n - 1, -1):
            end = self._latest_end[n].get(keys[n])
            if end is not None:
                return history[end + 1 : end + 1 + max_drafts], n
        return [], 0


@dataclass
class _SequenceState:
    index: NgramIndex
    drafts: list[int] = field(default_factory=list)  # the last proposal, after `index.tokens` ended
    match_n: int = 0  # the n-gram length it came from


class NgramProposer:
    """The `ngram` speculator: prompt lookup over each sequence's prompt and outputs."""

    def __init__(
        self,
        num_draft_tokens: int = DEFAULT_NUM_DRAFTS,
        min_n: int = DEFAULT_MIN_N,
        max_n: int = DEFAULT_MAX_N,
    ) -> None:
        if num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {num_draft_tokens}")
        _check_lengths(min_n, max_n)
        self.num_draft_tokens = num_draft_tokens
        self.min_n = min_n
        self.max_n = max_n
        self._sequences: dict[int, _SequenceState] = {}
        # Matches / observations per (n-gram length, draft position), from a Beta(1, 1) prior.
        self._matched = np.ones((max_n + 1, num_draft_tokens))
        self._observed = np.full((max_n + 1, num_draft_tokens), 2.0)

    @classmethod
    def build(cls, model: CausalLM, config: SpeculatorConfig) -> NgramProposer:
        """Prompt lookup needs nothing from the model."""
        del model
        num_drafts = config.num_draft_tokens or DEFAULT_NUM_DRAFTS
        if num_drafts < 1:
            raise SpeculatorError(f"ngram: num_draft_tokens must be >= 1, got {num_drafts}")
        return cls(num_drafts)

    def _learn(self, state: _SequenceState, emitted: Sequence[int]) -> None:
        """Count which of the previous drafts the emitted tokens matched, up to the first miss."""
        for j, (draft, token) in enumerate(zip(state.drafts, emitted)):
            self._observed[state.match_n, j] += 1
            if draft != token:
                return
            self._matched[state.match_n, j] += 1

    def _update(self, seq_id: int, token_ids: Sequence[int]) -> _SequenceState:
        """Bring a sequence's index up to its history, learning from what it emitted since the last
        proposal (a history shorter than the index means a new sequence under a reused id)."""
        state = self._sequences.get(seq_id)
        if state is None or len(state.index.tokens) > len(token_ids):
            state = self._sequences[seq_id] = _SequenceState(NgramIndex(self.min_n, self.max_n))
        new_tokens = token_ids[len(state.index.tokens) :]
        self._learn(state, new_tokens)
        state.index.extend(new_tokens)
        return state

    def propose(self, batch: ProposeBatch) -> Proposal:
        states = [self._update(request.seq_id, request.token_ids) for request in batch.requests]
        # after this step's evidence, whatever the row order; host lists: a few rows of K floats
        estimates = (self._matched / self._observed).tolist()
        width = min(max((request.num_drafts for request in batch.requests), default=0), self.num_draft_tokens)
        token_ids, confidences, num_drafts = [], [], []
        for request, state in zip(batch.requests, states):
            drafts, state.match_n = state.index.propose(min(request.num_drafts, width))
            state.drafts, pad = drafts, [0] * (width - len(drafts))
            num_drafts.append(len(drafts))
            token_ids.append(drafts + pad)
            confidences.append(estimates[state.match_n][: len(drafts)] + pad)
        return Proposal(
            token_ids=torch.tensor(token_ids, dtype=torch.int64).view(len(states), width),
            num_drafts=num_drafts,
            confidences=torch.tensor(confidences, dtype=torch.float32).view(len(states), width),
        )

    def release(self, seq_id: int) -> None:
        self._sequences.pop(seq_id, None)
