"""A small deterministic byte-level BPE tokenizer for tiny test models.

Trained on a short built-in English text, so sampled ids decode to word-like text. Layout:
ids 0/1/2 are BOS/EOS/PAD (the DeepSeek spellings), then the 256 byte pieces (high bytes alone decode
to invalid UTF-8), then BPE merges, then the DeepSeek chat special tokens and a few placeholders
(the DSpark noise token is `NOISE_TOKEN`). The text repeats case variants, accented forms,
compatibility characters and whitespace runs so the Engram normalisation has tokens to merge.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

BOS, EOS, PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
NOISE_TOKEN = "<｜place▁holder▁no▁799｜>"
CHAT_SPECIAL_TOKENS = (
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜System｜>",
    "<think>",
    "</think>",
    "<｜latest_reminder｜>",
    "｜DSML｜",
    "<｜image｜>",
    "<｜ref｜>",
    "<｜/ref｜>",
    "<｜box｜>",
    "<｜/box｜>",
    "<｜point｜>",
    "<｜/point｜>",
    "<｜polygon｜>",
    "<｜/polygon｜>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
)
PLACEHOLDERS = tuple(f"<｜place▁holder▁no▁{i}｜>" for i in (797, 798, 799))
DEFAULT_BPE_VOCAB = 1024

_TEXT = """\
The quick brown fox jumps over the lazy dog. A small model reads the text and writes an answer.
The weather today is warm and clear, and the river runs slowly past the old mill by the hill.
She said that the garden was full of roses, tulips and daisies in the spring of that year.
We looked at the map, chose a path through the forest, and walked until the evening light faded.
Numbers such as 1, 2, 3, 10, 42, 100 and 2026 appear in tables, lists and short reports.
Good morning! How are you? I am fine, thank you. What would you like to drink: tea or coffee?
The engine loads the weights, builds the cache, and answers each request one token at a time.
In the morning the baker opens the shop; by noon the bread is gone and the shelves are empty.
Children played in the park while their parents talked about work, travel and the news.
THE END. The end. the end. The End. HELLO hello Hello. WORLD world World. Café cafe CAFÉ café.
naïve naive Naïve résumé resume Résumé über uber Über déjà deja vu. Ångström angstrom.
ﬁne fine ﬂow flow Ｆｕｌｌ Full ｗｉｄｔｈ width ① 1 ² 2 ™ TM … ... ﬁnal final.
spaces  between   words    and\ttabs\t\tand\nnew\n\nlines\r\nhere.   Indented  text   too.
"""


def _corpus() -> list[str]:
    # repeat so every piece is frequent enough to be merged; lines keep the trainer's input small
    return _TEXT.splitlines(keepends=True) * 8


@lru_cache(maxsize=4)
def _build_json(bpe_vocab_size: int) -> str:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CHAT_SPECIAL_TOKENS])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in PLACEHOLDERS])
    return tok.to_str()


def build_synthetic_tokenizer(bpe_vocab_size: int = DEFAULT_BPE_VOCAB) -> Tokenizer:
    """A fresh tokenizer; identical (byte for byte in `to_str()`) for the same `bpe_vocab_size`."""
    return Tokenizer.from_str(_build_json(bpe_vocab_size))


def tokenizer_config(model_max_length: int = 1048576) -> dict:
    """The `tokenizer_config.json` that accompanies the synthetic `tokenizer.json`."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
    }


def save_tokenizer(tokenizer: Tokenizer, out_dir: str | Path, model_max_length: int = 1048576) -> None:
    """Write `tokenizer.json` and `tokenizer_config.json` into `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(tokenizer.to_str(pretty=True), encoding="utf-8")
    cfg = tokenizer_config(model_max_length)
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", "utf-8")
