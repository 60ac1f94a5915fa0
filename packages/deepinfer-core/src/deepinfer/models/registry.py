"""Model families keyed by the config's `architectures` entry: each maps to its runtime loader."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deepinfer.models.interface import CausalLM

# architecture -> "module:function"; the function takes (model_dir, **options) and returns a CausalLM
FAMILIES: dict[str, str] = {
    "DeepseekV41ForCausalLM": "deepinfer.models.deepseek_v41.runtime:load_runtime",
}


def family_loader(architecture: str) -> Callable[..., CausalLM]:
    if architecture not in FAMILIES:
        raise ValueError(f"architectures: {architecture!r} is not supported (known: {sorted(FAMILIES)})")
    module, func = FAMILIES[architecture].split(":")
    return getattr(importlib.import_module(module), func)


def load_model(model_dir: str | Path, **options: Any) -> CausalLM:
    """Load the checkpoint in `model_dir` with the runtime of its architecture (options: dtype, device,
    backend, options=RuntimeOptions(...) for DeepSeek-V4.1)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    archs = config.get("architectures") or []
    if len(archs) != 1:
        raise ValueError(f"architectures: expected exactly one entry, got {archs!r}")
    return family_loader(archs[0])(model_dir, **options)
