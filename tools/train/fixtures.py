"""Held-out fixture of the default model's tests: token windows and function headers from the eval split.

    python -m tools.train.fixtures [--out packages/deepinfer-core/tests/fixtures/default_model/heldout.json]

The runtime tests must not depend on which Python (and so which stdlib) runs them, so the held-out
material is frozen here: `windows` (token ids, BOS-separated files as in training) and `headers`
(single-line top-level `def` lines, without the newline: the tokenizer merges a newline with the next
line's indentation, so prompts end at the colon).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from tokenizers import Tokenizer

from tools.train.corpus import build_manifest, read_texts
from tools.train.data import eval_windows, token_stream

HEADER = re.compile(r"^def \w+\([^()]*\)( -> [\w\[\], .|]+)?:$")
DEFAULT_OUT = Path("packages/deepinfer-core/tests/fixtures/default_model/heldout.json")


def function_headers(texts: list[str], limit: int) -> list[str]:
    """Distinct single-line top-level function headers, in file order."""
    seen: list[str] = []
    for text in texts:
        for line in text.splitlines():
            if HEADER.match(line) and line not in seen:
                seen.append(line)
    return seen[:limit]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", type=Path, default=Path("checkpoints/tiny-stdlib/tokenizer.json"))
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--length", type=int, default=257)
    ap.add_argument("--headers", type=int, default=64)
    args = ap.parse_args()
    manifest = build_manifest()
    tok = Tokenizer.from_file(str(args.tokenizer))
    stream = token_stream(manifest, tok, "eval")
    windows = eval_windows(stream, args.length)
    step = max(1, windows.shape[0] // args.windows)  # spread over the whole split
    fixture = {
        "corpus_digest": manifest.digest,
        "python_version": manifest.python_version,
        "eval_files": list(manifest.eval_files),
        "windows": windows[::step][: args.windows].tolist(),
        "headers": function_headers(list(read_texts(manifest, "eval")), args.headers),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(fixture) + "\n")


if __name__ == "__main__":
    main()
