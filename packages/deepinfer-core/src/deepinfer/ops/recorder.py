"""What records a step of op launches for replay (a CUDA graph recorder): the model's graphs and the
sampler's graphs both take one. Here, under ops, because the sampler already depends on ops and must not
depend on a model package."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch


class Recorder(Protocol):
    def __call__(self, step: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, Callable[[], None]]:
        """Record `step`; return its output (a static tensor every replay rewrites) and the replay."""
        ...
