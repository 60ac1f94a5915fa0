"""Tiny release-format checkpoints on disk, as tests and benchmarks use them."""

from __future__ import annotations

from pathlib import Path

from deepinfer.checkpoint import write_checkpoint
from deepinfer.testing.configs import tiny_config
from deepinfer.tokenizer import build_synthetic_tokenizer


def write_tiny_checkpoint(name: str, out: str | Path, seed: int) -> Path:
    """Write tiny config `name` with random weights from `seed` (one shard, synthetic tokenizer)."""
    write_checkpoint(
        tiny_config(name), out, seed=seed, tokenizer=build_synthetic_tokenizer(), single_file=True,
        progress=False,
    )
    return Path(out)
