"""Per-step engine statistics: the share of the engine's CPU work the GPU did not wait for (from the GPU's
idle time between steps), and the engine pairing each step's start event with the step before's end."""

from __future__ import annotations

import pytest

from deepinfer.engine.stats import StepStat, hidden_share
from deepinfer.sampling import SamplingParams


def step(schedule_ms: float, process_ms: float, gpu_idle_ms: float | None) -> StepStat:
    return StepStat(4, 4, schedule_ms / 1e3, process_ms / 1e3, 0.005, 0.0, 0.010,
                    None if gpu_idle_ms is None else gpu_idle_ms / 1e3)


@pytest.mark.parametrize(("steps", "want"), [
    ([step(0.2, 0.8, 0.0)] * 3, 1.0),  # the GPU never waited: all hidden
    ([step(0.2, 0.8, 0.25)] * 4, 0.75),
    ([step(0.2, 0.8, 1.0), step(0.2, 0.8, 0.0)], 0.5),  # sums, not per-step shares
    ([step(0.1, 0.1, 0.5)] * 2, 0.0),  # idle beyond the CPU time (hand-off, GIL): clamped, not negative
    ([step(5.0, 5.0, None), step(0.3, 0.7, 0.5)], 0.5),  # a step without a measured gap is left out
    ([step(0.2, 0.8, None)] * 3, None),  # no CUDA events (CPU) or sync: not measured
    ([step(0.0, 0.0, 0.3)], None),  # no CPU work to hide
    ([], None),
])
def test_hidden_share(steps, want):
    got = hidden_share(steps)
    assert got == want if want is None else got == pytest.approx(want)


class FakeEvent:
    """A CUDA timing event at a fixed GPU time (ms), as StepResult.gpu holds."""

    def __init__(self, ms: float):
        self.ms = ms

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other: FakeEvent) -> float:
        return other.ms - self.ms


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_engine_records_gpu_idle_between_steps(make_engine, drain, monkeypatch, async_scheduling):
    """Step k spans GPU times [10k, 10k + 7] ms (k counted from the first step): 3 ms idle before each
    step after the first while steps follow back to back (async); sync steps have none measured."""
    engine = make_engine(async_scheduling=async_scheduling)
    execute, count = engine.runner.execute, iter(range(1000))

    def timed(sched):
        result = execute(sched)
        k = next(count)
        result.gpu = (FakeEvent(10.0 * k), FakeEvent(10.0 * k + 7.0))
        return result

    monkeypatch.setattr(engine.runner, "execute", timed)
    engine.add_request([5, 6, 7], SamplingParams(max_tokens=6, ignore_eos=True, temperature=0))
    drain(engine)
    steps = list(engine.stats.steps)
    assert len(steps) == 6 and all(s.gpu_s == pytest.approx(0.007) for s in steps)
    if async_scheduling:
        assert steps[0].gpu_idle_s is None  # nothing in flight before the first step
        assert [s.gpu_idle_s for s in steps[1:]] == pytest.approx([0.003] * 5)
    else:
        assert all(s.gpu_idle_s is None for s in steps) and hidden_share(steps) is None
