"""The pure-PyTorch backend: defines what every op means, runs on any torch device."""

from collections.abc import Callable

import torch

from deepinfer.ops.reference import REFERENCE_OPS
from deepinfer.ops.registry import Backend


class ReferenceBackend(Backend):
    name = "reference"
    package = "deepinfer-core"
    priority = 0

    def supports(self, device: torch.device) -> bool:
        return True

    def ops(self) -> dict[str, Callable]:
        return dict(REFERENCE_OPS)
