"""Confidence-scheduled verification: how many drafts each request verifies in a decode step.

A request always feeds its golden token; verifying k of its drafts adds k query tokens and
a_1 + ... + a_k expected emitted tokens, where a_j (the cumulative confidence) is the probability that
its first j drafts are all accepted. The step's value is expected tokens per millisecond:

    (R + sum_r sum_{j <= k_r} a[r, j]) / step_ms[R + sum_r k_r]

For a fixed total the numerator is largest when it holds the batch's largest a values; because each row
of a is nonincreasing, those are per-request prefixes (a stable sort keeps ties in row order). So one
ranking of all drafts gives the best split for every total at once, and the best total is an argmax
over R*K + 1 candidates: exact, with no search over per-request choices.

`schedule_verification` decides on the host (numpy: the decision is needed as host integers anyway,
and every step pays for it). `split_fixed_total` is the device half for a step planned before the
previous step's confidences reach the host: the host picks the total from the confidences it has (one
step older) and the split is redone on the device from the newest ones (torch, fixed shapes, no host
sync); given the host's total and the same confidences it reproduces the host's choice exactly. An
asynchronous engine step is planned that way: each sequence with every draft it holds (an upper bound),
the total from `choose` over the estimates of the drafts before (on the host), the split by
`ConfidenceScheduler.split` on the device, and the step's metadata built there from the split
(deepinfer.models.deepseek_v41.device_metadata), so the forward computes the T rows chosen.
`ConfidenceScheduler` is the engine-facing object: host lists in, the latency curve profiled and
tracked inside.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence, Sized
from dataclasses import dataclass

import numpy as np
import torch

from deepinfer.speculators.interface import SpeculatorConfig
from deepinfer_spec.latency import LatencyCurve, default_profile_sizes


@dataclass(frozen=True)
class VerifyPlan:
    """One decode step's verification choice."""

    num_drafts: np.ndarray  # [R] int64: drafts each request verifies (its seqlen_q is 1 + this)
    total_tokens: int  # R + num_drafts.sum(): the step's query tokens before any graph padding
    expected_tokens: float  # R + the sum of the chosen cumulative confidences
    step_ms: float  # step_ms[total_tokens]


def cumulative_confidence(confidence: torch.Tensor) -> torch.Tensor:
    """Per-position acceptance estimates c_j [R, K] -> a_j = prod_{i <= j} c_i (nonincreasing in j).

    float64 products taken left to right, as the host scheduler's `np.cumprod` takes them (a device
    scan may associate them differently), so host and device rank bitwise the same values."""
    conf = confidence.double()
    products = list(conf.unbind(-1))
    for j in range(1, len(products)):
        products[j] = products[j - 1] * products[j]
    return torch.stack(products, dim=-1) if products else conf


def _check_shape(cum_conf: np.ndarray | torch.Tensor, max_drafts: Sized | None) -> tuple[int, int]:
    if cum_conf.ndim != 2:
        raise ValueError(
            f"cumulative confidences must be [requests, drafts], got shape {tuple(cum_conf.shape)}"
        )
    if max_drafts is not None and len(max_drafts) != cum_conf.shape[0]:
        raise ValueError(
            f"max_drafts must hold one count per request ({cum_conf.shape[0]}), got {len(max_drafts)}"
        )
    return cum_conf.shape[0], cum_conf.shape[1]


def schedule_verification(
    cum_conf: np.ndarray | torch.Tensor,
    step_ms: np.ndarray | torch.Tensor,
    max_drafts: Sequence[int] | np.ndarray | None = None,
) -> VerifyPlan:
    """The per-request draft counts that maximise expected tokens per millisecond (host variant).

    cum_conf [R, K]: a[r, j-1] = probability that request r's first j drafts are all accepted.
    step_ms [>= R*(K+1) + 1]: predicted step milliseconds indexed by the step's total query tokens
        (`LatencyCurve.table`), positive.
    max_drafts [R] (optional): drafts actually proposed per request; the rest are never verified.
    Host arrays (numpy or CPU tensors). Ties go to the smaller total.
    """
    num_requests, max_k = _check_shape(cum_conf, max_drafts)
    if isinstance(cum_conf, torch.Tensor) and cum_conf.device.type != "cpu":
        raise ValueError(
            f"schedule_verification decides on the host; got confidences on {cum_conf.device} "
            "(split a chosen total on the device with split_fixed_total)"
        )
    conf = np.asarray(cum_conf, dtype=np.float64)
    if not ((conf >= 0) & (conf <= 1)).all():
        raise ValueError("cumulative confidences must lie in [0, 1] (NaN found or out of range)")
    if (conf[:, 1:] > conf[:, :-1]).any():
        raise ValueError(
            "cumulative confidences must be nonincreasing along the drafts (pass cumulative_confidence(c), "
            "not the per-position c)"
        )
    last_total = num_requests * (max_k + 1)
    latency = np.asarray(step_ms, dtype=np.float64)
    if latency.ndim != 1 or latency.size <= last_total:
        raise ValueError(
            f"step_ms must be 1-D with an entry for every total up to {last_total} tokens "
            f"(R={num_requests}, K={max_k}), got shape {latency.shape}"
        )
    if max_drafts is not None:  # unproposed drafts rank after every proposed one
        conf = np.where(np.arange(max_k) < np.asarray(max_drafts)[:, None], conf, -1.0)
    values = conf.reshape(-1)
    order = np.argsort(-values, kind="stable")
    ranked = values[order]
    num_proposed = int(np.count_nonzero(ranked >= 0))
    expected = np.empty(num_proposed + 1)
    expected[0] = 0.0
    np.cumsum(ranked[:num_proposed], out=expected[1:])
    expected += num_requests
    rate = expected / latency[num_requests : num_requests + num_proposed + 1]
    best = int(np.argmax(rate))  # the first maximum: the smallest best total
    chosen = np.zeros(values.size, dtype=np.int64)
    chosen[order[:best]] = 1
    return VerifyPlan(
        num_drafts=chosen.reshape(num_requests, max_k).sum(axis=1),
        total_tokens=num_requests + best,
        expected_tokens=float(expected[best]),
        step_ms=float(latency[num_requests + best]),
    )


def split_fixed_total(
    cum_conf: torch.Tensor, total_tokens: int, max_drafts: torch.Tensor | None = None
) -> torch.Tensor:
    """Split a step total chosen earlier among the requests by their newest confidences (device variant).

    Gives the `total_tokens - R` drafts with the largest cumulative confidence (fewer if fewer are
    proposed), the same ranking as `schedule_verification` (float64 values, ties to the earlier
    request and draft), so the split of the host's chosen total is the host's choice exactly; fixed
    shapes and no host sync, so it runs on the device inside an asynchronous step. cum_conf [R, K] and
    max_drafts [R] as there, on one device; returns num_drafts [R] int64 there. Values are not checked
    (that would sync).
    """
    num_requests, max_k = _check_shape(cum_conf, max_drafts)
    if not num_requests <= total_tokens <= num_requests * (max_k + 1):
        raise ValueError(
            f"total_tokens must be in [{num_requests}, {num_requests * (max_k + 1)}] for "
            f"R={num_requests} requests and K={max_k} drafts, got {total_tokens}"
        )
    values = cum_conf.double()
    if max_drafts is not None:
        proposed = torch.arange(max_k, device=cum_conf.device) < max_drafts[:, None]
        values = torch.where(proposed, values, -1.0)
    values = values.reshape(-1)
    order = torch.sort(values, descending=True, stable=True).indices
    # each draft's place in that ranking (`chosen[order[:n]] = 1` synchronised in CUDA sync-debug mode)
    rank = torch.argsort(order)
    chosen = (rank < total_tokens - num_requests) & (values >= 0)
    return chosen.view(num_requests, max_k).sum(dim=1)


def expected_tokens_per_ms(
    cum_conf: np.ndarray | torch.Tensor, num_drafts: Sequence[int] | np.ndarray, step_ms: np.ndarray
) -> float:
    """The objective of a given choice: (R + chosen cumulative confidences) / step_ms[total tokens]."""
    conf = np.asarray(cum_conf, dtype=np.float64)
    counts = np.asarray(num_drafts)
    chosen = np.arange(conf.shape[1]) < counts[:, None]
    return (conf.shape[0] + float(conf[chosen].sum())) / float(step_ms[conf.shape[0] + int(counts.sum())])


class ConfidenceScheduler:
    """The engine's verification scheduler (`deepinfer.speculators.interface.VerifyScheduler`).

    Until a latency curve exists (`profile`, or one passed in) every sequence verifies all its drafts,
    as the official engine does without a performance curve; afterwards each step's choice maximises
    expected tokens per millisecond, and every recorded step refines the curve.
    """

    def __init__(self, config: SpeculatorConfig | None = None, curve: LatencyCurve | None = None) -> None:
        del config  # K comes with each step's confidences
        self.curve = curve

    def profile(
        self,
        time_step: Callable[[int], float],
        max_tokens: int,
        *,
        sizes: Sequence[int] | None = None,
        padded: bool = False,
    ) -> None:
        """Build the curve from `time_step(total_tokens) -> ms` (a decode forward + verification of that
        many query tokens) at `sizes` (default: `default_profile_sizes(max_tokens)`). With CUDA graphs
        pass their bucket sizes and `padded=True`: a step then costs its whole bucket."""
        self.curve = LatencyCurve.profile(
            time_step, default_profile_sizes(max_tokens) if sizes is None else sizes, padded=padded
        )

    def choose(self, confidences: list[list[float]]) -> list[int]:
        """Per sequence, its drafts' conditional acceptance estimates c_1..c_m -> drafts to verify (0..m)."""
        counts = [len(row) for row in confidences]
        max_k = max(counts, default=0)
        padded = np.array([[*row, *[0.0] * (max_k - len(row))] for row in confidences], dtype=np.float64)
        return self.choose_padded(padded.reshape(len(counts), max_k), counts).tolist()

    def choose_padded(
        self, confidences: np.ndarray | torch.Tensor, num_drafts: Sequence[int] | np.ndarray
    ) -> np.ndarray:
        """`choose` on a padded [R, K] host array of conditional estimates (entries past a row's
        num_drafts ignored), e.g. `Proposal.confidences` moved to the CPU: no per-row Python work."""
        counts = np.asarray(num_drafts, dtype=np.int64)
        conf = np.asarray(confidences, dtype=np.float64)
        if conf.ndim != 2 or counts.shape != (conf.shape[0],):
            raise ValueError(
                f"confidences must be [R, K] with one draft count per row, "
                f"got {conf.shape} and {counts.shape}"
            )
        if self.curve is None or conf.size == 0:
            return counts
        step_ms = self.curve.table(conf.shape[0] * (conf.shape[1] + 1))
        ragged = counts if counts.min() < conf.shape[1] else None
        # Zero past each row's count, whatever the padding holds (NaN included).
        proposed = np.where(np.arange(conf.shape[1]) < counts[:, None], conf, 0.0)
        return schedule_verification(np.cumprod(proposed, axis=1), step_ms, ragged).num_drafts

    def split(self, confidences: torch.Tensor, max_drafts: torch.Tensor, num_drafts: int) -> torch.Tensor:
        """The device half of an asynchronous step: `num_drafts` drafts in all (the host's total, from
        `choose` over older estimates; at most max_drafts.sum()) split by the newest conditional
        estimates [R, K], at most max_drafts[r] (device [R]) each, entries past that ignored (NaN
        included); drafts per request [R] int64 on their device, with no host sync. Given the estimates
        `choose` saw and the total it chose, this is its choice."""
        proposed = torch.arange(confidences.shape[1], device=confidences.device) < max_drafts[:, None]
        conf = torch.where(proposed, confidences.double().nan_to_num(0.0).clamp(0.0, 1.0), 0.0)
        return split_fixed_total(cumulative_confidence(conf), confidences.shape[0] + num_drafts, max_drafts)

    def record(self, num_seqs: int, num_tokens: int, seconds: float) -> None:
        """A measured decode step: `num_tokens` query tokens of `num_seqs` sequences took `seconds`."""
        if num_tokens < num_seqs:
            raise ValueError(f"a step has at least one token per sequence: {num_tokens} < {num_seqs}")
        if self.curve is not None:
            self.curve.observe(num_tokens, seconds * 1e3)
