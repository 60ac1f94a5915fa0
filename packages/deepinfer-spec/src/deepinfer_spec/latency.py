"""Step-latency curve for confidence-scheduled verification: predicted decode-step milliseconds as a
function of the step's total query tokens.

Profiled once at start-up by timing forwards of a few sizes, then tracked online: every observed decode
step moves the curve toward what it measured (an exponential moving average per profiled size), so the
curve follows the slow growth of attention cost as contexts lengthen. Predictions use the running
maximum over sizes, so a larger step is never predicted faster than a smaller one; between sizes the
curve is linear (eager steps) or, with `padded`, the cost of the smallest size that holds the total (a
step padded to a CUDA-graph bucket costs the whole bucket).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from itertools import pairwise

import numpy as np

_MIN_MS = 1e-3


def default_profile_sizes(max_tokens: int) -> list[int]:
    """Powers of two below max_tokens, then max_tokens: few sizes, dense where batches are small."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    sizes = [1 << i for i in range(max_tokens.bit_length()) if 1 << i < max_tokens]
    return [*sizes, max_tokens]


def _trimmed_mean(samples: Sequence[float]) -> float:
    """Mean without the fastest and slowest sample (when there are at least three)."""
    ordered = sorted(samples)
    kept = ordered[1:-1] if len(ordered) >= 3 else ordered
    return sum(kept) / len(kept)


def _check_ms(ms: float, what: str) -> float:
    if not (math.isfinite(ms) and ms > 0):
        raise ValueError(f"{what} must be a positive finite number of milliseconds, got {ms}")
    return float(ms)


class LatencyCurve:
    """Measured step milliseconds at increasing total-token sizes, interpolated and tracked online."""

    def __init__(
        self, sizes: Sequence[int], step_ms: Sequence[float], *, padded: bool = False, ema: float = 0.1
    ) -> None:
        if len(sizes) == 0 or len(sizes) != len(step_ms):
            raise ValueError(
                "sizes and step_ms must be non-empty and of equal length, "
                f"got {len(sizes)} and {len(step_ms)}"
            )
        if sizes[0] < 1 or any(b <= a for a, b in pairwise(sizes)):
            raise ValueError(f"sizes must be positive and strictly increasing, got {list(sizes)}")
        if not 0 < ema <= 1:
            raise ValueError(f"ema must be in (0, 1], got {ema}")
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self._ms = np.array([_check_ms(ms, f"step_ms[{i}]") for i, ms in enumerate(step_ms)])
        self.padded = padded
        self.ema = ema
        self._table: np.ndarray | None = None

    @classmethod
    def profile(
        cls,
        time_step: Callable[[int], float],
        sizes: Sequence[int],
        *,
        warmup: int = 1,
        repeats: int = 5,
        padded: bool = False,
        ema: float = 0.1,
    ) -> LatencyCurve:
        """Time `time_step(total_tokens) -> ms` at each size: `warmup` discarded calls, then the trimmed
        mean of `repeats` calls."""
        if repeats < 1 or warmup < 0:
            raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
        measured = []
        for size in sizes:
            for _ in range(warmup):
                time_step(size)
            measured.append(_trimmed_mean([time_step(size) for _ in range(repeats)]))
        return cls(sizes, measured, padded=padded, ema=ema)

    @property
    def step_ms(self) -> np.ndarray:
        """Current per-size milliseconds as predicted (running maximum over sizes)."""
        return np.maximum.accumulate(self._ms)

    def _predict(self, totals: np.ndarray) -> np.ndarray:
        ms = self.step_ms
        if self.padded:
            out = ms[np.minimum(np.searchsorted(self.sizes, totals, side="left"), len(ms) - 1)]
        else:
            out = np.interp(totals, self.sizes, ms)
        # Past the largest size: extend the last segment (or scale proportionally from a single size).
        if len(ms) >= 2:
            slope = (ms[-1] - ms[-2]) / (self.sizes[-1] - self.sizes[-2])
        else:
            slope = ms[-1] / self.sizes[-1]
        beyond = totals > self.sizes[-1]
        return np.where(beyond, ms[-1] + slope * (totals - self.sizes[-1]), out)

    def predict(self, total_tokens: int) -> float:
        """Predicted milliseconds of a step with `total_tokens` query tokens."""
        return float(self._predict(np.asarray([total_tokens]))[0])

    def table(self, max_tokens: int) -> np.ndarray:
        """step_ms[t] for every total t in [0, max_tokens] (float64; longer if cached longer), as
        `schedule_verification` takes it; cached until the next `observe`."""
        if self._table is None or self._table.size <= max_tokens:
            self._table = self._predict(np.arange(max_tokens + 1))
        return self._table

    def observe(self, total_tokens: int, ms: float) -> None:
        """Fold one measured decode step (its unpadded total and wall milliseconds) into the curve.

        The error against the raw curve at `total_tokens` moves the one or two sizes that define it,
        each by `ema` times its interpolation weight (at a profiled size: a plain moving average).
        """
        ms = _check_ms(ms, "observed step time")
        if total_tokens < 1:
            raise ValueError(f"total_tokens must be >= 1, got {total_tokens}")
        right = int(np.searchsorted(self.sizes, total_tokens, side="left"))
        if right == len(self.sizes):  # past the largest size: shift the extrapolated line's anchor
            self._ms[-1] += self.ema * (ms - self.predict(total_tokens))
        elif self.padded or right == 0 or self.sizes[right] == total_tokens:
            self._ms[right] += self.ema * (ms - self._ms[right])
        else:
            left = right - 1
            weight = (total_tokens - self.sizes[left]) / (self.sizes[right] - self.sizes[left])
            error = ms - ((1 - weight) * self._ms[left] + weight * self._ms[right])
            self._ms[left] += self.ema * (1 - weight) * error
            self._ms[right] += self.ema * weight * error
        self._ms = np.maximum(self._ms, _MIN_MS)  # a far-off error must not make a size free or negative
        self._table = None
