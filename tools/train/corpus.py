"""The training corpus: the Python standard library's source, which every machine has.

Selection rule: every `*.py` file under the stdlib root, the stdlib's own test suites included (they
are more than half of the code), except files below a directory named `site-packages` or
`dist-packages` (third-party code) or `__pycache__`, or whose bytes are not valid UTF-8. Files are
sorted by relative POSIX path. The digest is SHA-256 over every
(relative path, file bytes) pair, each length-prefixed so that no two corpora share a byte stream.
The held-out split is a pure function of the relative path, so it is stable when files are added or
removed. Python versions ship different stdlibs: the manifest records which one it came from.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import sysconfig
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
DEFAULT_EVAL_FRACTION = 0.02
_SPLIT_BUCKETS = 10_000


def stdlib_root() -> Path:
    """The running interpreter's standard library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def list_corpus_files(root: str | Path) -> list[str]:
    """Relative POSIX paths of the `*.py` files under `root` that the selection rule keeps, sorted.

    Only the path rule applies here; the UTF-8 check needs the bytes and happens in `build_manifest`.
    """
    base = Path(root)
    if not base.is_dir():
        raise NotADirectoryError(f"corpus root {base} is not a directory")
    paths = []
    for path in base.rglob("*.py"):
        rel = path.relative_to(base)
        if path.is_file() and not EXCLUDED_DIRS.intersection(rel.parts[:-1]):
            paths.append(rel.as_posix())
    return sorted(paths)


def is_eval_file(rel_path: str, eval_fraction: float = DEFAULT_EVAL_FRACTION) -> bool:
    """Whether a file belongs to the held-out split: a hash bucket of its relative path."""
    bucket = int.from_bytes(hashlib.sha256(rel_path.encode("utf-8")).digest()[:8], "big") % _SPLIT_BUCKETS
    return bucket < round(eval_fraction * _SPLIT_BUCKETS)


@dataclass(frozen=True)
class Manifest:
    root: str
    python_version: str
    digest: str  # SHA-256 hex over (relative path, bytes) of `files`, in order
    files: tuple[str, ...]
    train_files: tuple[str, ...]
    eval_files: tuple[str, ...]
    train_bytes: int
    eval_bytes: int
    eval_fraction: float

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=1) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, path: str | Path) -> Manifest:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        for key in ("files", "train_files", "eval_files"):
            data[key] = tuple(data[key])
        return cls(**data)


def build_manifest(root: str | Path | None = None, eval_fraction: float = DEFAULT_EVAL_FRACTION) -> Manifest:
    """Select, digest and split the corpus under `root` (default: this interpreter's stdlib)."""
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must lie strictly between 0 and 1, got {eval_fraction}")
    base = Path(root) if root is not None else stdlib_root()
    digest = hashlib.sha256()
    files, train, held_out = [], [], []
    sizes = {"train": 0, "eval": 0}
    skipped = 0
    for rel in list_corpus_files(base):
        data = (base / rel).read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            skipped += 1
            continue
        name = rel.encode("utf-8")
        for part in (name, data):
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)
        files.append(rel)
        split = "eval" if is_eval_file(rel, eval_fraction) else "train"
        (held_out if split == "eval" else train).append(rel)
        sizes[split] += len(data)
    if not files:
        raise ValueError(f"no corpus files found under {base}")
    log.info(
        "corpus %s: %d files (%d skipped as non-UTF-8), train %d files / %d bytes, eval %d files / %d bytes",
        base,
        len(files),
        skipped,
        len(train),
        sizes["train"],
        len(held_out),
        sizes["eval"],
    )
    return Manifest(
        root=str(base),
        python_version=platform.python_version(),
        digest=digest.hexdigest(),
        files=tuple(files),
        train_files=tuple(train),
        eval_files=tuple(held_out),
        train_bytes=sizes["train"],
        eval_bytes=sizes["eval"],
        eval_fraction=eval_fraction,
    )


def read_texts(manifest: Manifest, split: str = "train") -> Iterator[str]:
    """The decoded text of each file of `split` ("train" or "eval"), in manifest order."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    names = manifest.train_files if split == "train" else manifest.eval_files
    for rel in names:
        yield (Path(manifest.root) / rel).read_text(encoding="utf-8")
