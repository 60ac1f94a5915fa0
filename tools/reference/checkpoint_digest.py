"""Digests that tie a recorded nemo reference to the checkpoint it was recorded on.

Shared by the recorder (nemo venv, run as a script from this folder) and
packages/deepinfer-core/tests/test_parity_nemo.py (repo venv), so both sides hash the same way; it
needs only torch and safetensors, which both environments have.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import safe_open


def read_checkpoint(ckpt: Path) -> dict[str, torch.Tensor]:
    """All tensors named in model.safetensors.index.json, read from their shards."""
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    by_shard: dict[str, list[str]] = {}
    for name, shard in index["weight_map"].items():
        by_shard.setdefault(shard, []).append(name)
    tensors = {}
    for shard, names in sorted(by_shard.items()):
        with safe_open(str(ckpt / shard), framework="pt") as f:
            present = set(f.keys())
            for name in names:
                if name not in present:
                    raise KeyError(f"index maps {name} to {shard}, which does not contain it")
                tensors[name] = f.get_tensor(name)
            extra = present - set(names)
            if extra:
                raise KeyError(f"{shard} holds tensors missing from the index: {sorted(extra)[:5]}")
    return tensors


def tensor_digest(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over (name, dtype, shape, raw bytes) in name order; independent of sharding."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(f"{name}|{str(t.dtype).removeprefix('torch.')}|{list(t.shape)}\n".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def file_digests(ckpt: Path) -> dict[str, str]:
    """sha256 of config.json (canonical JSON) and tokenizer.json: they change the model too."""
    config = json.loads((ckpt / "config.json").read_text())
    return {
        "config.json": hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest(),
        "tokenizer.json": hashlib.sha256((ckpt / "tokenizer.json").read_bytes()).hexdigest(),
    }
