"""Engram's compressed vocabulary (model spec §9.1): token id -> compressed id.

Each id is decoded alone. Text containing U+FFFD (a byte piece that is not valid UTF-8 by itself)
keys on the raw token string; other text keys on its normalised form (NFKC, NFD, accents stripped,
lowercase, whitespace runs collapsed, stripped — a lone space survives). Compressed ids are handed
out in order of first appearance over ids 0, 1, 2, ...
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Regex, Tokenizer, normalizers

_PROTECT = "\ue000"  # private-use stand-in so a text that is exactly one space survives the strip


def _normalizer() -> normalizers.Normalizer:
    return normalizers.Sequence(
        [
            normalizers.NFKC(),
            normalizers.NFD(),
            normalizers.StripAccents(),
            normalizers.Lowercase(),
            normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
            normalizers.Replace(Regex(r"^ $"), _PROTECT),
            normalizers.Strip(),
            normalizers.Replace(_PROTECT, " "),
        ]
    )


@dataclass(frozen=True)
class CompressedVocab:
    token_map: tuple[int, ...]  # compressed id of every tokenizer id
    size: int  # number of distinct compressed ids (= engram_compressed_vocab_size)

    def pad_id(self, pad_token_id: int) -> int:
        return self.token_map[pad_token_id]


def compressed_vocab(tokenizer: Tokenizer) -> CompressedVocab:
    """Build the compressed vocabulary of a `tokenizers.Tokenizer` (added tokens included)."""
    norm = _normalizer()
    keys: dict[str, int] = {}
    token_map = []
    for token_id in range(tokenizer.get_vocab_size(with_added_tokens=True)):
        text = tokenizer.decode([token_id], skip_special_tokens=False)
        if "\ufffd" in text:
            key = tokenizer.id_to_token(token_id) or ""
        else:
            key = norm.normalize_str(text) or text
        token_map.append(keys.setdefault(key, len(keys)))
    return CompressedVocab(tuple(token_map), len(keys))
