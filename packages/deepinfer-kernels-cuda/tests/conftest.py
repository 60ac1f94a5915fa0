"""Shared fixtures of the kernel tests: the cuda backend's ops and the reference ops on the GPU, checks
run under Triton's CPU interpreter, and benchmarks/slice_diff.py with a tiny model run on it."""

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

from deepinfer.ops import Ops, get_ops
from deepinfer.testing.configs import tiny_config


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


def _run_in_interpreter(script: str, timeout: float = 600) -> None:
    """Runs `script` in a new Python process with Triton's CPU interpreter on (it must be switched on
    before triton is imported, hence the process); the script signals success by printing "ok" last."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


@pytest.fixture(scope="session")
def run_in_interpreter() -> Callable[..., None]:
    """`run_in_interpreter(script, timeout=600)`: fails unless the script prints "ok" last and exits 0."""
    return _run_in_interpreter


@pytest.fixture(scope="session")
def sd() -> ModuleType:
    """benchmarks/slice_diff.py, loaded by path (benchmarks is no package)."""
    path = Path(__file__).resolve().parents[3] / "benchmarks" / "slice_diff.py"
    spec = importlib.util.spec_from_file_location("slice_diff", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def tiny_full_logits(sd: ModuleType) -> Callable[[Ops], list[torch.Tensor]]:
    """`tiny_full_logits(ops)`: per-step logits of the "full" tiny config (C2 compressors, Engram, DSpark)
    in float32 on the GPU with `ops`: one set of random weights, a 20-token prompt, 4 decode steps through
    CUDA graphs."""
    rf = sd.reference_forward_module()
    config = tiny_config("full")
    tensors = rf.random_weights(config, torch.device("cuda"))
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, config.text.vocab_size, (20,), generator=gen).tolist()
    token_map = rf.token_map(config)
    return lambda ops: sd.run_slice(config, tensors, token_map, ops, torch.float32, prompt, 4, graphs=True)
