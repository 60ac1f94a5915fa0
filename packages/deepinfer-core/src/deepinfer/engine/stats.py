"""Per-step engine statistics: CPU overhead, device time, and how much of the CPU work async hides."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(slots=True)
class StepStat:
    num_seqs: int  # sequences in the step
    num_tokens: int
    schedule_s: float  # engine thread CPU time planning this step
    process_s: float  # engine thread CPU time turning this step's samples into outputs (after they arrive)
    device_s: float  # worker: resets + forward + sampling
    idle_s: float | None  # worker idle between the previous step's end and this one's start
    gpu_s: float | None = None  # CUDA: GPU time from the step's first to its last queued work
    # CUDA, a step in flight before: the GPU's idle time from that step's end event to this one's start
    # event (zero when this step was queued before the GPU ran out of work)
    gpu_idle_s: float | None = None


def hidden_share(steps: Iterable[StepStat]) -> float | None:
    """Share of the engine's CPU work per step (schedule + post-process) that the GPU did not wait for.

    Over the steps with a measured GPU gap (CUDA events, a step in flight before: async scheduling):
    1 - (GPU idle between steps) / (engine CPU time), clamped at 0. Between two steps the GPU waits for
    nothing but the engine thread (post-processing the step before, planning the next) and the hand-off
    to the worker (the worker's own host time lies inside a step's span), so idle time past the CPU time
    is hand-off or GIL waiting: it does not make the share negative. None where nothing was measured
    (no CUDA events, or synchronous steps, where the GPU waits for all of it by design)."""
    timed = [s for s in steps if s.gpu_idle_s is not None]
    cpu = sum(s.schedule_s + s.process_s for s in timed)
    if not cpu:
        return None
    idle = sum(s.gpu_idle_s for s in timed)  # type: ignore[misc]
    return max(0.0, 1.0 - idle / cpu)


@dataclass
class EngineStats:
    steps: deque[StepStat] = field(default_factory=lambda: deque(maxlen=100_000))
    generated_tokens: int = 0
    num_preemptions: int = 0
    # speculative decoding: sequence-steps that verified drafts, drafts verified, drafts accepted
    spec_verify_steps: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = field(default_factory=list)  # [j]: verifications accepting draft j

    def count_accepted_positions(self, num_accepted: int) -> None:
        """A verification accepts a prefix of its drafts: positions 0..num_accepted-1 count once each."""
        per_pos = self.spec_accepted_per_pos
        per_pos.extend([0] * (num_accepted - len(per_pos)))
        for j in range(num_accepted):
            per_pos[j] += 1

    def mean_accepted_length(self) -> float | None:
        """Tokens emitted per verifying sequence-step (accepted drafts + the target's token)."""
        if not self.spec_verify_steps:
            return None
        return 1.0 + self.spec_accepted_tokens / self.spec_verify_steps
