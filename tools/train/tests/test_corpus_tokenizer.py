"""The training corpus manifest and the tokenizer trained on it (issue 11, items 1-2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from deepinfer.tokenizer import compressed_vocab
from tools.train.corpus import Manifest, build_manifest, is_eval_file, list_corpus_files, stdlib_root
from tools.train.tokenizer import (
    SPECIAL_TOKENS,
    TrainedTokenizer,
    train_corpus_tokenizer,
    train_tokenizer,
)

_SOURCES = {
    "alpha.py": "def add(a, b):\n    return a + b\n",
    "pkg/__init__.py": "from pkg.beta import Beta\n",
    "pkg/beta.py": 'class Beta:\n    """Café."""\n\n    def value(self) -> int:\n        return 42\n',
    "pkg/gamma.py": "import os\n\nPATH = os.path.join('a', 'b')\nprint(PATH)\n",
    "test/test_alpha.py": "assert True\n",
    "pkg/tests/helper.py": "X = 1\n",
    "site-packages/other.py": "Y = 2\n",
    "notes.txt": "not python\n",
}


def _write_corpus(root: Path) -> Path:
    for rel, text in _SOURCES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text * 20, encoding="utf-8")
    (root / "latin1.py").write_bytes(b"# caf\xe9\n")
    return root


def test_selection_rule_and_determinism(tmp_path: Path) -> None:
    root = _write_corpus(tmp_path / "lib")
    first = build_manifest(root)
    assert first.files == (
        "alpha.py",
        "pkg/__init__.py",
        "pkg/beta.py",
        "pkg/gamma.py",
        "pkg/tests/helper.py",
        "test/test_alpha.py",
    )
    assert build_manifest(root) == first
    assert first.train_bytes + first.eval_bytes == sum(len((root / f).read_bytes()) for f in first.files)


def test_digest_tracks_content_and_paths(tmp_path: Path) -> None:
    root = _write_corpus(tmp_path / "lib")
    before = build_manifest(root).digest
    (root / "pkg/gamma.py").write_text("PATH = 'changed'\n", encoding="utf-8")
    changed = build_manifest(root).digest
    (root / "pkg/gamma.py").rename(root / "pkg/delta.py")
    renamed = build_manifest(root).digest
    assert len({before, changed, renamed}) == 3


def test_split_is_stable_and_disjoint(tmp_path: Path) -> None:
    root = _write_corpus(tmp_path / "lib")
    manifest = build_manifest(root, eval_fraction=0.5)
    assert set(manifest.train_files).isdisjoint(manifest.eval_files)
    assert sorted(manifest.train_files + manifest.eval_files) == list(manifest.files)
    # membership depends on the path alone, so adding a file leaves the others where they were
    (root / "zeta.py").write_text("Z = 3\n", encoding="utf-8")
    grown = build_manifest(root, eval_fraction=0.5)
    assert set(manifest.eval_files) <= set(grown.eval_files)
    names = [f"mod{i}.py" for i in range(2000)]
    share = sum(is_eval_file(n) for n in names) / len(names)
    assert 0.01 < share < 0.03


def test_manifest_json_round_trip(tmp_path: Path) -> None:
    manifest = build_manifest(_write_corpus(tmp_path / "lib"))
    manifest.write(tmp_path / "manifest.json")
    assert Manifest.read(tmp_path / "manifest.json") == manifest


def test_bad_inputs_are_named(tmp_path: Path) -> None:
    with pytest.raises(NotADirectoryError, match="corpus root"):
        build_manifest(tmp_path / "missing")
    with pytest.raises(ValueError, match="no corpus files"):
        build_manifest(tmp_path)
    with pytest.raises(ValueError, match="eval_fraction"):
        build_manifest(tmp_path, eval_fraction=1.0)


def test_real_stdlib_listing() -> None:
    files = list_corpus_files(stdlib_root())
    assert "os.py" in files and "json/decoder.py" in files
    assert files == sorted(files)
    assert not any(part in {"site-packages", "__pycache__"} for f in files for part in f.split("/")[:-1])


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> TrainedTokenizer:
    root = _write_corpus(tmp_path_factory.mktemp("lib"))
    return train_corpus_tokenizer(build_manifest(root), tmp_path_factory.mktemp("tok"), vocab_size=400)


def test_training_is_deterministic(trained: TrainedTokenizer) -> None:
    texts = [text * 20 for text in _SOURCES.values()]
    assert train_tokenizer(texts, 400).to_str() == train_tokenizer(texts, 400).to_str()
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(texts, 256)


def test_compressed_vocab(trained: TrainedTokenizer) -> None:
    reloaded = Tokenizer.from_file(str(trained.path))
    assert compressed_vocab(reloaded) == trained.compressed
    token_map = trained.compressed.token_map
    assert len(token_map) == reloaded.get_vocab_size(with_added_tokens=True)
    assert trained.compressed.size == len(set(token_map)) == max(token_map) + 1
    assert trained.compressed.pad_id(2) == 2  # BOS, EOS, PAD are the first three keys


def test_special_tokens_are_single_ids(trained: TrainedTokenizer) -> None:
    tok = Tokenizer.from_file(str(trained.path))
    ids = [tok.encode(t).ids for t in SPECIAL_TOKENS]
    assert all(len(i) == 1 for i in ids)
    assert [i[0] for i in ids[:3]] == [0, 1, 2]  # BOS/EOS/PAD keep the DeepSeek ids
    assert len({i[0] for i in ids}) == len(SPECIAL_TOKENS)
    assert tok.get_vocab_size(with_added_tokens=True) <= 400


@settings(max_examples=25, deadline=None)
@given(st.text(max_size=60) | st.sampled_from(["<think>x</think>", "\t  def f():\n\n", "｜DSML｜é🎉"]))
def test_round_trip(trained: TrainedTokenizer, text: str) -> None:
    tok = trained.tokenizer
    assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text
