"""DeepSeek V4/V4.1 protocol and token layer (Rust core, PyO3 bindings)."""

from deepseek_recipe._native import *  # noqa: F403

__version__ = "0.2.0"
IMAGE_SPECIAL_TOKEN_ID = 129264
