"""A step's proposal on its way to the next step, which never waits for drafting to finish.

The draft ids stay where the proposer made them (DSpark: on the device) and are copied to the host
behind the drafting, with the confidences. The next step is planned from the draft counts alone (on
the host at once), its forward reads the ids on the device, and its verification reads their host
copy only after that forward was launched. Only a synchronous confidence schedule waits for the copy
before planning (it plans from the confidences; an asynchronous one plans from older estimates).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer.sampling.sampler import HostCopy
from deepinfer.speculators.interface import Proposal


class ProposedDrafts:
    """One `Proposal` of a step: device ids and distributions, host copies on demand."""

    def __init__(self, proposal: Proposal) -> None:
        self.token_ids = proposal.token_ids  # [n, K] where the proposer made them
        self.probs = proposal.probs
        self.confidences = proposal.confidences  # [n, K] where made (an async confidence split reads them)
        confidences = [] if proposal.confidences is None else [proposal.confidences]
        self._copy = HostCopy(proposal.token_ids, *confidences)
        self._host: tuple[list[list[int]], list[list[float]] | None] | None = None
        self.counts = proposal.num_drafts

    def rows(self) -> list[NextDrafts]:
        """Each request's drafts (made on demand: a list kept here would be a reference cycle, and
        the device tensors would wait for the garbage collector)."""
        return [NextDrafts(self, i, n) for i, n in enumerate(self.counts)]

    def host(self) -> tuple[list[list[int]], list[list[float]] | None]:
        """Host ids and confidences (None: not estimated): waits for their copy the first time."""
        if self._host is None:
            ids, *confidences = (t.tolist() for t in self._copy.get())
            self._host = ids, confidences[0] if confidences else None
        return self._host


@dataclass(frozen=True)
class NextDrafts:
    """One sequence's drafts for its next step: row `row` of a proposal, `count` of them."""

    proposal: ProposedDrafts
    row: int
    count: int

    def tokens(self) -> list[int]:
        return self.proposal.host()[0][self.row][: self.count]

    def confidences(self) -> list[float] | None:
        """P(draft j accepted | the drafts before it accepted), if the proposer estimated them."""
        confidences = self.proposal.host()[1]
        return None if confidences is None else confidences[self.row][: self.count]

    @property
    def probs(self) -> torch.Tensor | None:
        """[count, V] the distributions the drafts were drawn from (device); None: one-hot drafts."""
        probs = self.proposal.probs
        return None if probs is None else probs[self.row, : self.count]
