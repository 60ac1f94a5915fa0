"""Building blocks for training the default model: the stdlib corpus and its tokenizer."""

from deepinfer.training.corpus import Manifest, build_manifest, list_corpus_files, read_texts, stdlib_root
from deepinfer.training.tokenizer import TrainedTokenizer, train_corpus_tokenizer, train_tokenizer

__all__ = [
    "Manifest",
    "TrainedTokenizer",
    "build_manifest",
    "list_corpus_files",
    "read_texts",
    "stdlib_root",
    "train_corpus_tokenizer",
    "train_tokenizer",
]
