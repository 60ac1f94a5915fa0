"""A stand-in for CUDA graph recording off the GPU: the 'graph' runs its step again on replay."""

from __future__ import annotations

from collections.abc import Callable

import torch


def rerun_recorder(step: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, Callable[[], None]]:
    """A `Recorder` whose replay re-runs `step` into the first run's output (reads the same persistent
    buffers a recorded graph would)."""
    out = step()
    return out, lambda: out.copy_(step())
