"""The llguidance backend: grammars compiled against the model's `tokenizer.json`.

llguidance builds its token trie straight from the tokenizer JSON (no transformers), compiles JSON
Schema, regex and Lark lazily (milliseconds), rolls back (speculation) and fills many rows in parallel
on its own threads with the GIL released.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import llguidance
import numpy as np

from deepinfer.sampling.params import StructuredOutputs
from deepinfer.structured.dsml import DSML
from deepinfer.structured.grammar import grammar_text


class LLGuidanceMatcher:
    __slots__ = ("m",)

    def __init__(self, m: llguidance.LLMatcher):
        self.m = m

    def accept(self, token: int) -> bool:
        return self.m.consume_token(token)

    def rollback(self, n: int) -> None:
        if n and not self.m.rollback(n):
            raise ValueError(f"cannot roll back {n} tokens: {self.m.get_error()}")

    def error(self) -> str | None:
        return self.m.get_error() if self.m.is_error() else None

    def fork(self) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self.m.deep_copy())


class LLGuidanceBackend:
    """`tokenizer`: a `tokenizers.Tokenizer`, or an object holding one as `.tokenizer` (the engine's
    `TextTokenizer`); `vocab_size`: the model's logits width; `eos_token_id`: what ends a finished
    grammar."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_id: int, threads: int | None = None):
        hf = getattr(tokenizer, "tokenizer", tokenizer)
        if not hasattr(hf, "to_str"):
            raise ValueError("structured output needs the model's tokenizer.json (a `tokenizers` tokenizer)")
        self._hf = hf
        self.vocab_size = vocab_size
        self.tokenizer = llguidance.LLTokenizer(hf.to_str(), n_vocab=vocab_size, eos_token=eos_token_id)
        dsml = hf.token_to_id(DSML)
        # the marker's id when llguidance matches it only as a token; None when it is plain text
        self.dsml_id = dsml if dsml is not None and self.tokenizer.is_special_token(dsml) else None
        self._executor = llguidance.LLExecutor(threads)

    def compile(self, spec: StructuredOutputs) -> LLGuidanceMatcher:
        m = llguidance.LLMatcher(self.tokenizer, grammar_text(spec, self.dsml_id), log_level=0)
        if m.is_error():
            raise ValueError(f"invalid {spec.kind}: {m.get_error().split('<state>')[0].strip()}")
        return LLGuidanceMatcher(m)

    def fill(self, rows: Sequence[tuple[LLGuidanceMatcher, int]], bitmask: np.ndarray) -> None:
        assert bitmask.dtype == np.int32 and bitmask.flags.c_contiguous
        self._executor.unsafe_compute_mask_ptr([(m.m, i) for m, i in rows], bitmask.ctypes.data,
                                               bitmask.shape[1] * 4, bitmask.shape[0])

    def encode(self, text: str) -> list[int]:
        return self._hf.encode(text, add_special_tokens=False).ids
