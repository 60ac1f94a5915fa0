"""The contract between the engine and a speculator plugin (proposer) and verification scheduler.

A step of a speculating sequence runs the segment [last sampled token, d_1 .. d_k] with logits for
every row; the engine then verifies the drafts exactly (`deepinfer.speculators.verify`: greedy keeps
the prefix equal to the target argmax, sampling uses the acceptance test and residual resampling, so
the output distribution is the target's), appends the accepted tokens plus one target token, and asks
the proposer for the next drafts of every sequence that just sampled. Rollback is the model's: the
next segment simply starts after the accepted tokens (`CausalLM.max_backtrack` >= k).

A proposer is built once per engine around the loaded model and runs on the engine's worker thread,
after the step's forward and verification, in step order. It sees per sequence the newly sampled
token (host and device), its position, the whole token history, the request's sampling settings and
seed; a model-coupled proposer (DSpark) also reads the model's caches through the slot. It returns the
draft ids, optionally the distribution each draft was drawn from (kept on the device for the
acceptance test; None means the drafts are deterministic) and per-draft acceptance estimates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, overload

import torch

from deepinfer.models.interface import CausalLM
from deepinfer.sampling.params import SamplingParams


@dataclass(frozen=True)
class SpeculatorConfig:
    num_draft_tokens: int | None = None  # K: most drafts per sequence and step; None: the proposer's default


class History(Sequence[int]):
    """A sequence's tokens followed by the ones its step just emitted, read in place: building the
    joined list would copy the whole (often long) history for every request and step. Valid during
    the `propose` call only (the engine appends to the underlying list afterwards)."""

    __slots__ = ("base", "tail")

    def __init__(self, base: list[int], tail: list[int]) -> None:
        self.base, self.tail = base, tail

    def __len__(self) -> int:
        return len(self.base) + len(self.tail)

    @overload
    def __getitem__(self, i: int) -> int: ...

    @overload
    def __getitem__(self, i: slice) -> list[int]: ...

    def __getitem__(self, i: int | slice) -> int | list[int]:
        n = len(self.base)
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1:
                return [*self.base, *self.tail][i]
            return self.base[start:min(stop, n)] + self.tail[max(start - n, 0):max(stop - n, 0)]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"history index {i} out of range ({len(self)} tokens)")
        return self.base[i] if i < n else self.tail[i - n]


@dataclass(frozen=True)
class ProposeRequest:
    """One sequence that sampled a token this step: propose up to `num_drafts` tokens after it."""

    seq_id: int  # stable for the sequence's life; `Proposer.release` names it when it ends
    slot: int  # its model state slot: the caches hold every position before `position`
    position: int  # position of the newly sampled token (not yet fed to the model)
    token_ids: Sequence[int]  # the whole sequence on the host (prompt + outputs), ending in that token;
    # a `History` view: copy what must outlive the call
    params: SamplingParams
    seed: int  # int64 bit pattern; draft draws use rng.uniform(seed, draft position, PURPOSE_DRAFT)
    num_drafts: int  # 1 <= num_drafts <= Proposer.num_draft_tokens


@dataclass
class ProposeBatch:
    requests: list[ProposeRequest]
    sampled: torch.Tensor  # [n] int64 on the model's device: each request's newly sampled token


@dataclass
class Proposal:
    """Drafts for a ProposeBatch, row i for request i, K = max num_drafts of the batch."""

    token_ids: torch.Tensor  # [n, K] int64 draft ids (any device); entries past a row's count unused
    num_drafts: list[int]  # host: drafts proposed per row, 0 <= count <= the row's num_drafts
    # [n, K, V] float32 on the model's device: the (normalised) distribution draft j was drawn from.
    # None: deterministic drafts (a one-hot distribution), e.g. prompt lookup.
    probs: torch.Tensor | None = None
    # [n, K] float32 in [0, 1]: estimated P(draft j accepted | drafts before it accepted); None: none.
    confidences: torch.Tensor | None = None


class Proposer(Protocol):
    """A speculator plugin: the class registered under the `deepinfer.speculators` entry points."""

    num_draft_tokens: int  # K in use: the config's, or the proposer's default

    @classmethod
    def build(cls, model: CausalLM, config: SpeculatorConfig) -> Proposer:
        """The proposer for `model`; raises `SpeculatorError` naming what is missing if it cannot
        serve it (a DSpark proposer on a checkpoint without DSpark blocks)."""
        ...

    def propose(self, batch: ProposeBatch) -> Proposal: ...

    def release(self, seq_id: int) -> None:
        """The sequence finished or was aborted: drop any per-sequence state. (A preempted sequence
        keeps its id and is proposed for again once recomputed, with the same history.)"""


class VerifyScheduler(Protocol):
    """Chooses, per step, how many of its drafts each speculating sequence verifies."""

    def profile(self, time_step: Callable[[int], float], max_tokens: int) -> None:
        """Build the step-latency curve at start-up: `time_step(total query tokens) -> milliseconds` of a
        decode-shaped forward + verification, for totals up to `max_tokens`."""

    def choose(self, confidences: list[list[float]]) -> list[int]:
        """Per sequence, its drafts' conditional acceptance estimates c_1..c_m (m = drafts it holds)
        -> how many of them to verify now (0..m), to maximise expected tokens per unit of time."""
        ...

    def record(self, num_seqs: int, num_tokens: int, seconds: float) -> None:
        """A measured decode step (sequences, query tokens, forward + verification time)."""
