"""Shared fixtures of the GPU kernel tests: the cuda backend's ops and the reference ops on the GPU."""

import pytest
import torch

from deepinfer.ops import Ops, get_ops


@pytest.fixture(scope="session")
def cuda_ops() -> Ops:
    return get_ops("cuda", "cuda")


@pytest.fixture(scope="session")
def ref_ops() -> Ops:
    return get_ops("reference", "cuda")


@pytest.fixture
def poison(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.empty/empty_like fill with NaN (floats) or 0xA5 bytes, so outputs a kernel skips show."""
    empty, empty_like = torch.empty, torch.empty_like

    def fill(t: torch.Tensor) -> torch.Tensor:
        if t.is_floating_point() and t.element_size() > 1:
            return t.fill_(float("nan"))
        return t.view(torch.uint8).fill_(0xA5).view(t.dtype) if t.numel() and t.dim() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: fill(empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: fill(empty_like(*a, **k)))
