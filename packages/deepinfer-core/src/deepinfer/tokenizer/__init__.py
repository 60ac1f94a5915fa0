"""Tokenizer helpers: Engram's compressed vocabulary and a synthetic tokenizer for tiny models."""

from deepinfer.tokenizer.engram_vocab import CompressedVocab, compressed_vocab
from deepinfer.tokenizer.synthetic import NOISE_TOKEN, build_synthetic_tokenizer, save_tokenizer

__all__ = [
    "NOISE_TOKEN",
    "CompressedVocab",
    "build_synthetic_tokenizer",
    "compressed_vocab",
    "save_tokenizer",
]
