"""Per-step engine statistics: CPU overhead, device time, and how much of the CPU work async hides."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class StepStat:
    num_seqs: int  # sequences in the step
    num_tokens: int
    schedule_s: float  # engine thread CPU time planning this step
    process_s: float  # engine thread CPU time turning this step's samples into outputs
    device_s: float  # worker: resets + forward + sampling
    idle_s: float | None  # worker idle between the previous step's end and this one's start
    gpu_s: float | None = None  # CUDA: GPU time from the step's first to its last queued work


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

    def hidden_fraction(self) -> float | None:
        """Share of the per-step CPU work (schedule + post-process) during which the device was busy."""
        timed = [s for s in self.steps if s.idle_s is not None]
        cpu = sum(s.schedule_s + s.process_s for s in timed)
        if not cpu:
            return None
        return max(0.0, 1.0 - sum(s.idle_s for s in timed) / cpu)  # type: ignore[misc]
