"""DeepInfer: inference for DeepSeek-V4.1 / V4 models.

`from deepinfer import LLM, SamplingParams` is the offline API; the names load lazily so that
`import deepinfer` (and the CLI's start) stays cheap.
"""

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "LLM": "deepinfer.entrypoints.llm",
    "SamplingParams": "deepinfer.sampling",
    "LLMEngine": "deepinfer.engine",
    "EngineConfig": "deepinfer.engine",
}
__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'deepinfer' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
