"""Confidence-scheduled verification: how many drafts each request verifies in a decode step.

A request always feeds its golden token; verifying k of its drafts adds k query tokens and
a_1 + ... + a_k expected emitted tokens, where a_j (the cumulative confidence) is the probability that
its first j drafts are all accepted. The step's value is expected tokens per millisecond:

    (R + sum_r sum_{j <= k_r} a[r, j]) / step_ms[R + sum_r k_r]

For a fixed total the numerator is largest when it holds the batch's largest a values; because each row
of a is nonincreasing, those are per-request prefixes (a stable sort keeps ties in row order). So one
ranking of all drafts gives the best split for every total at once, and the best total is an argmax
over R*K + 1 candidates: exact, with no search over per-request choices.

Under asynchronous scheduling the host picks the total from the confidences it has (one step older),
and `split_fixed_total` redoes the per-request split on the device from the newest confidences with
fixed shapes and no host sync. `ConfidenceScheduler` is the engine-facing object: host lists in,
the latency curve profiled and tracked inside.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from deepinfer.speculators.interface import SpeculatorConfig
from deepinfer_spec.latency import LatencyCurve, default_profile_sizes


@dataclass(frozen=True)
class VerifyPlan:
    """One decode step's verification choice."""

    num_drafts: torch.Tensor  # [R] int64: drafts each request verifies (its seqlen_q is 1 + this)
    total_tokens: int  # R + num_drafts.sum(): the step's query tokens before any graph padding
    expected_tokens: float  # R + the sum of the chosen cumulative confidences
    step_ms: float  # step_ms[total_tokens]


def cumulative_confidence(confidence: torch.Tensor) -> torch.Tensor:
    """Per-position acceptance estimates c_j [R, K] -> a_j = prod_{i <= j} c_i (nonincreasing in j)."""
    return torch.cumprod(confidence, dim=-1)


def _proposed_values(cum_conf: torch.Tensor, max_drafts: torch.Tensor | None) -> torch.Tensor:
    """Flat [R*K] cumulative confidences; drafts at j >= max_drafts[r] (not proposed) become -1."""
    if cum_conf.dim() != 2:
        raise ValueError(
            f"cumulative confidences must be [requests, drafts], got shape {tuple(cum_conf.shape)}"
        )
    values = cum_conf if cum_conf.is_floating_point() else cum_conf.float()
    if max_drafts is not None:
        if max_drafts.shape != cum_conf.shape[:1]:
            raise ValueError(
                f"max_drafts must be [{cum_conf.shape[0]}] (one per request), got {tuple(max_drafts.shape)}"
            )
        position = torch.arange(cum_conf.shape[1], device=cum_conf.device)
        values = torch.where(position < max_drafts.to(cum_conf.device)[:, None], values, -1.0)
    return values.reshape(-1)


def _count_first(
    values: torch.Tensor, order: torch.Tensor, num_selected: int, shape: torch.Size
) -> torch.Tensor:
    """Per-request count of proposed drafts among the first `num_selected` ranked ones.

    The ranking is a stable descending sort of nonincreasing rows, so each count is a prefix length.
    """
    selected = torch.zeros(order.numel(), dtype=torch.int64, device=order.device)
    selected[order[:num_selected]] = 1
    return (selected * (values >= 0)).view(shape).sum(dim=1)


def _check_confidences(cum_conf: torch.Tensor) -> None:
    if not bool(((cum_conf >= 0) & (cum_conf <= 1)).all()):
        raise ValueError("cumulative confidences must lie in [0, 1] (NaN found or out of range)")
    if bool((cum_conf[:, 1:] > cum_conf[:, :-1]).any()):
        raise ValueError(
            "cumulative confidences must be nonincreasing along the drafts (pass cumulative_confidence(c), "
            "not the per-position c)"
        )


def schedule_verification(
    cum_conf: torch.Tensor, step_ms: torch.Tensor, max_drafts: torch.Tensor | None = None
) -> VerifyPlan:
    """The per-request draft counts that maximise expected tokens per millisecond (host variant).

    cum_conf [R, K]: a[r, j-1] = probability that request r's first j drafts are all accepted.
    step_ms [>= R*(K+1) + 1]: predicted step milliseconds indexed by the step's total query tokens
        (`LatencyCurve.table`), positive.
    max_drafts [R] (optional): drafts actually proposed per request; the rest are never verified.
    Ties go to the smaller total. Returns Python numbers, so on an accelerator this syncs once.
    """
    values = _proposed_values(cum_conf, max_drafts)
    _check_confidences(cum_conf)
    num_requests, max_k = cum_conf.shape
    last_total = num_requests * (max_k + 1)
    if step_ms.dim() != 1 or step_ms.numel() <= last_total:
        raise ValueError(
            f"step_ms must be 1-D with an entry for every total up to {last_total} tokens "
            f"(R={num_requests}, K={max_k}), got shape {tuple(step_ms.shape)}"
        )
    ranked, order = torch.sort(values, descending=True, stable=True)
    gains = ranked.clamp(min=0)
    expected = torch.cat([gains.new_zeros(1), torch.cumsum(gains, dim=0)]) + num_requests
    latency = step_ms[num_requests : last_total + 1].to(device=gains.device, dtype=gains.dtype)
    rate = expected / latency
    rate[int((ranked >= 0).sum()) + 1 :] = float("-inf")  # totals that would need unproposed drafts
    best = int(torch.argmax(rate))  # the first maximum: the smallest best total
    return VerifyPlan(
        num_drafts=_count_first(values, order, best, cum_conf.shape),
        total_tokens=num_requests + best,
        expected_tokens=float(expected[best]),
        step_ms=float(latency[best]),
    )


def split_fixed_total(
    cum_conf: torch.Tensor, total_tokens: int, max_drafts: torch.Tensor | None = None
) -> torch.Tensor:
    """Split a step total chosen earlier among the requests by their newest confidences (device variant).

    Gives the `total_tokens - R` drafts with the largest cumulative confidence (fewer if fewer are
    proposed); fixed shapes and no host sync, so it runs on the device inside an asynchronous step.
    Inputs as `schedule_verification`; returns num_drafts [R] int64 on cum_conf's device. Values are
    not checked (that would sync).
    """
    values = _proposed_values(cum_conf, max_drafts)
    num_requests, max_k = cum_conf.shape
    if not num_requests <= total_tokens <= num_requests * (max_k + 1):
        raise ValueError(
            f"total_tokens must be in [{num_requests}, {num_requests * (max_k + 1)}] for "
            f"R={num_requests} requests and K={max_k} drafts, got {total_tokens}"
        )
    order = torch.sort(values, descending=True, stable=True).indices
    return _count_first(values, order, total_tokens - num_requests, cum_conf.shape)


def expected_tokens_per_ms(cum_conf: torch.Tensor, num_drafts: torch.Tensor, step_ms: torch.Tensor) -> float:
    """The objective of a given choice: (R + chosen cumulative confidences) / step_ms[total tokens]."""
    position = torch.arange(cum_conf.shape[1], device=cum_conf.device)
    chosen = position < num_drafts.to(cum_conf.device)[:, None]
    expected = cum_conf.shape[0] + float((cum_conf * chosen).sum())
    return expected / float(step_ms[cum_conf.shape[0] + int(num_drafts.sum())])


class ConfidenceScheduler:
    """The engine's verification scheduler (`deepinfer.speculators.interface.VerifyScheduler`).

    Until a latency curve exists (`profile`, or one passed in) every sequence verifies all its drafts,
    as the official engine does without a performance curve; afterwards each step's choice maximises
    expected tokens per millisecond, and every recorded step refines the curve.
    """

    def __init__(self, config: SpeculatorConfig | None = None, curve: LatencyCurve | None = None) -> None:
        del config  # K comes with each step's confidences
        self.curve = curve

    def profile(self, time_step: Callable[[int], float], max_tokens: int, *, padded: bool = False) -> None:
        """Build the curve from `time_step(total_tokens) -> ms` (a decode forward + verification of that
        many query tokens) at `default_profile_sizes(max_tokens)`; `padded` when steps run as CUDA graphs
        whose sizes are those buckets."""
        self.curve = LatencyCurve.profile(time_step, default_profile_sizes(max_tokens), padded=padded)

    def choose(self, confidences: list[list[float]]) -> list[int]:
        """Per sequence, its drafts' conditional acceptance estimates c_1..c_m -> drafts to verify (0..m)."""
        counts = [len(row) for row in confidences]
        max_k = max(counts, default=0)
        if self.curve is None or max_k == 0:
            return counts
        padded = np.zeros((len(confidences), max_k), dtype=np.float32)
        for row, values in enumerate(confidences):
            padded[row, : len(values)] = values
        cum_conf = cumulative_confidence(torch.from_numpy(padded))
        step_ms = self.curve.table(len(confidences) * (max_k + 1))
        plan = schedule_verification(cum_conf, step_ms, max_drafts=torch.tensor(counts))
        return plan.num_drafts.tolist()

    def record(self, num_seqs: int, num_tokens: int, seconds: float) -> None:
        """A measured decode step: `num_tokens` query tokens of `num_seqs` sequences took `seconds`."""
        if num_tokens < num_seqs:
            raise ValueError(f"a step has at least one token per sequence: {num_tokens} < {num_seqs}")
        if self.curve is not None:
            self.curve.observe(num_tokens, seconds * 1e3)
