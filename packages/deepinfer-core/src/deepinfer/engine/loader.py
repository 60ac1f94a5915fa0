"""Loading a checkpoint directory into a model runtime and a text tokenizer for the engine."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import tokenizers
import torch

from deepinfer.models.interface import CausalLM

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class TextTokenizer:
    """A `tokenizers.Tokenizer` with the engine's encode/decode signature.

    `encode` prepends the BOS token when the checkpoint names one (DeepSeek prompts start with it);
    chat prompts rendered by deepseek_recipe already contain it and are encoded there.
    """

    def __init__(self, tokenizer: tokenizers.Tokenizer, bos_token: str | None = None):
        self.tokenizer = tokenizer
        self.bos_id = tokenizer.token_to_id(bos_token) if bos_token else None

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> TextTokenizer:
        model_dir = Path(model_dir)
        tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        cfg_path = model_dir / "tokenizer_config.json"
        bos = json.loads(cfg_path.read_text("utf-8")).get("bos_token") if cfg_path.exists() else None
        if isinstance(bos, dict):  # {"content": ...} form of tokenizer_config.json
            bos = bos.get("content")
        return cls(tok, bos)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if self.bos_id is not None else ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def load_model(model_dir: str | Path, *, backend: str | None = None, dtype: str = "float32",
               device: torch.device | str = "cpu") -> CausalLM:
    """The runtime for the checkpoint's architecture, on `device`, computing in `dtype`."""
    from deepinfer.models.registry import load_model as load_family

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    logger.info("loading %s (dtype %s, device %s, backend %s)", model_dir, dtype, device, backend or "auto")
    return load_family(model_dir, dtype=DTYPES[dtype], device=device, backend=backend)
