"""Loading a checkpoint directory into a model runtime and a text tokenizer for the engine."""

from __future__ import annotations

import json
import logging
from functools import cached_property
from pathlib import Path
from typing import Any, get_args

import tokenizers
import torch

from deepinfer.checkpoint.loader import CheckpointError
from deepinfer.checkpoint.safetensors_io import INDEX_FILE, SINGLE_FILE
from deepinfer.distributed.state import parallel_state
from deepinfer.engine.config import LoadFormat
from deepinfer.models.interface import CausalLM

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
LOAD_FORMATS: tuple[str, ...] = get_args(LoadFormat)


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

    @cached_property
    def byte_pieces(self) -> tuple[list[bytes], frozenset[int]] | None:
        """For byte-level BPE: the bytes each id decodes to, and the special ids; None otherwise.

        Lets the detokenizer turn a token into text with a table look-up and an incremental UTF-8
        decoder instead of re-decoding a window of ids (the cost that dominates post-processing).
        """
        if not isinstance(self.tokenizer.decoder, tokenizers.decoders.ByteLevel):
            return None
        to_byte = {c: b for b, c in _byte_alphabet().items()}
        added = self.tokenizer.get_added_tokens_decoder()
        pieces = []
        for i in range(self.vocab_size):
            if i in added:
                pieces.append(added[i].content.encode())
            else:
                token = self.tokenizer.id_to_token(i)
                pieces.append(b"" if token is None else bytes(to_byte[c] for c in token))
        return pieces, frozenset(i for i, a in added.items() if a.special)

    def encode(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if self.bos_id is not None else ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def _byte_alphabet() -> dict[int, str]:
    """Byte-level BPE's printable stand-in for each byte: printable Latin-1 bytes stand for themselves,
    the others are mapped in order onto code points from 256 up."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    alphabet = {b: chr(b) for b in printable}
    extra = (b for b in range(256) if b not in alphabet)
    alphabet.update({b: chr(256 + k) for k, b in enumerate(extra)})
    return alphabet


def resolve_dtype(name: str, device: torch.device | str, checkpoint_dtype: str) -> str:
    """`auto`: the checkpoint's dtype on an accelerator, float32 on the CPU (where bf16 matmuls are slow
    and parity work wants full precision)."""
    if name == "auto":
        return checkpoint_dtype if torch.device(device).type != "cpu" else "float32"
    if name not in DTYPES:
        raise ValueError(f"dtype must be auto or one of {sorted(DTYPES)}, got {name!r}")
    return name


def default_cache_precision(device: torch.device | str) -> str:
    """`release` (the official engine's FP8/FP4 cache, what makes the real model fit) on CUDA; `exact`
    (the compute dtype, for parity work) elsewhere."""
    return "release" if torch.device(device).type == "cuda" else "exact"


def load_model(model_dir: str | Path, *, backend: str | None = None, dtype: str = "float32",
               device: torch.device | str = "cpu", load_format: str = "auto", seed: int = 0,
               **options: Any) -> CausalLM:
    """The runtime for the checkpoint's architecture, on `device`, computing in `dtype`; `options` go
    to the family's loader (DeepSeek-V4.1: `options=RuntimeOptions(...)`).

    `load_format`: "auto" reads the safetensors; "dummy" generates seeded random weights (from `seed`)
    in their storage formats from config.json alone, for benchmarks without a checkpoint on disk."""
    from deepinfer.models.registry import load_model as load_family

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format must be one of {', '.join(LOAD_FORMATS)}, got {load_format!r}")
    if load_format == "auto":
        check_weights_present(model_dir)
    elif parallel_state() is not None:
        raise ValueError("load_format dummy: not supported with data/expert parallelism yet (each rank "
                         "loads only its shard of the experts and Engram rows)")
    logger.info("loading %s (dtype %s, device %s, backend %s, load format %s)", model_dir, dtype, device,
                backend or "auto", load_format)
    return load_family(model_dir, dtype=DTYPES[dtype], device=device, backend=backend,
                       load_format=load_format, seed=seed, **options)


def check_weights_present(model_dir: str | Path) -> None:
    """A directory without safetensors (e.g. `make-checkpoint --config-only`) fails here, saying so."""
    model_dir = Path(model_dir)
    if not (model_dir / INDEX_FILE).is_file() and not (model_dir / SINGLE_FILE).is_file():
        raise CheckpointError(
            f"{model_dir} has no weights: neither {INDEX_FILE} nor {SINGLE_FILE} found; for random "
            "weights generated from its config.json use load format dummy (--load-format dummy, "
            "LLM(..., load_format='dummy'))")
