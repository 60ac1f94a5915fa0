"""Train the default model's byte-level BPE on the corpus and derive its Engram compressed vocabulary.

Layout follows the synthetic tokenizer: ids 0/1/2 are BOS/EOS/PAD (so `engram_pad_token_id` stays 2),
then the 256 byte pieces and the merges, then the DeepSeek chat special tokens and placeholders
(the DSpark noise token among them). `vocab_size` is the total including the added tokens.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from deepinfer.tokenizer import CompressedVocab, compressed_vocab, save_tokenizer
from deepinfer.tokenizer.synthetic import BOS, CHAT_SPECIAL_TOKENS, EOS, PAD, PLACEHOLDERS
from tools.train.corpus import Manifest, read_texts

log = logging.getLogger(__name__)

DEFAULT_VOCAB_SIZE = 4096
RESERVED_TOKENS = (BOS, EOS, PAD)
ADDED_TOKENS = CHAT_SPECIAL_TOKENS + PLACEHOLDERS
SPECIAL_TOKENS = RESERVED_TOKENS + ADDED_TOKENS
_MIN_VOCAB = 256 + len(SPECIAL_TOKENS)


def train_tokenizer(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> Tokenizer:
    """A byte-level BPE over `texts` with at most `vocab_size` ids (fewer if the texts run out of merges)."""
    if vocab_size <= _MIN_VOCAB:
        raise ValueError(f"vocab_size must exceed {_MIN_VOCAB} (bytes + special tokens), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(ADDED_TOKENS),
        min_frequency=2,
        show_progress=False,
        special_tokens=list(RESERVED_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ADDED_TOKENS])
    return tok


@dataclass(frozen=True)
class TrainedTokenizer:
    tokenizer: Tokenizer
    compressed: CompressedVocab  # its size is the config's `engram_compressed_vocab_size`
    path: Path  # the saved tokenizer.json


def train_corpus_tokenizer(
    manifest: Manifest, out_dir: str | Path, vocab_size: int = DEFAULT_VOCAB_SIZE
) -> TrainedTokenizer:
    """Train on the manifest's training split, save `tokenizer.json` (+ config) in `out_dir`."""
    start = time.perf_counter()
    log.info(
        "training BPE (vocab %d) on %d files, %d bytes",
        vocab_size,
        len(manifest.train_files),
        manifest.train_bytes,
    )
    tok = train_tokenizer(read_texts(manifest, "train"), vocab_size)
    save_tokenizer(tok, out_dir)
    compressed = compressed_vocab(tok)
    log.info(
        "tokenizer: %d ids, %d compressed ids, %.1f s",
        tok.get_vocab_size(with_added_tokens=True),
        compressed.size,
        time.perf_counter() - start,
    )
    return TrainedTokenizer(tok, compressed, Path(out_dir) / "tokenizer.json")
