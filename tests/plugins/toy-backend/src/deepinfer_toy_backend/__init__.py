"""Claims the CPU with a high priority and overrides one op, so tests can see selection and fallback."""

import torch

from deepinfer.ops import Backend


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.full_like(x, 7.0)  # recognisable, so a test can tell which backend served the op


class ToyBackend(Backend):
    name = "toy"
    package = "deepinfer-toy-backend"
    priority = 50

    def supports(self, device: torch.device) -> bool:
        return device.type == "cpu"

    def ops(self):
        return {"rms_norm": rms_norm}


class ToySpeculator:
    name = "toy-draft"
