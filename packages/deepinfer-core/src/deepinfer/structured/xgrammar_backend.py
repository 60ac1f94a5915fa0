"""xgrammar (what the official engine uses): not a dependency; `pip install xgrammar` to use it.

xgrammar precomputes most of a grammar's token masks when compiling (tens to hundreds of ms), so its
masks for JSON schemas cost tens of µs where llguidance's lazily built ones cost hundreds
(docs/performance.md#structured-output). `RoutedBackend` (`DEEPINFER_STRUCTURED_BACKEND=xgrammar`)
sends JSON, regex and choice constraints to it and grammars and tool calls to llguidance (their Lark
and DSML grammars are llguidance's). `XGrammarBackend` alone reads `grammar` as xgrammar's EBNF.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import xgrammar as xgr

from deepinfer.sampling.params import StructuredOutputs
from deepinfer.structured.backend import Matcher
from deepinfer.structured.dsml import JSON_STYLE
from deepinfer.structured.llguidance_backend import LLGuidanceBackend

ROUTED_KINDS = frozenset({"json_schema", "json_object", "regex", "choice"})


class XGrammarMatcher:
    """xgrammar's matcher has no copy: a fork replays the accepted tokens on a new one."""

    __slots__ = ("compiled", "history", "m", "rejected")

    def __init__(self, compiled: xgr.CompiledGrammar):
        self.compiled = compiled
        self.m = xgr.GrammarMatcher(compiled, max_rollback_tokens=-1)
        self.history: list[int] = []
        self.rejected: int | None = None

    def accept(self, token: int) -> bool:
        if self.rejected is None and self.m.accept_token(token):
            self.history.append(token)
            return True
        self.rejected = token if self.rejected is None else self.rejected
        return False

    def rollback(self, n: int) -> None:
        if n:
            self.m.rollback(n)
            del self.history[len(self.history) - n:]

    def error(self) -> str | None:
        return None if self.rejected is None else f"token {self.rejected} is not allowed"

    def fork(self) -> XGrammarMatcher:
        copy = XGrammarMatcher(self.compiled)
        for token in self.history:
            copy.accept(token)
        return copy


class XGrammarBackend:
    """Same arguments as `LLGuidanceBackend`; the tokenizer must be byte-level BPE (DeepSeek's are)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_id: int, threads: int = 2):
        hf = getattr(tokenizer, "tokenizer", tokenizer)
        vocab = [hf.id_to_token(i) or "" for i in range(hf.get_vocab_size(with_added_tokens=True))]
        self._hf = hf
        self.vocab_size = vocab_size
        info = xgr.TokenizerInfo(vocab, xgr.VocabType.BYTE_LEVEL, vocab_size=vocab_size,
                                 stop_token_ids=[eos_token_id])
        self._compiler = xgr.GrammarCompiler(info, max_threads=threads)

    def compile(self, spec: StructuredOutputs) -> XGrammarMatcher:
        c = self._compiler
        sep = (JSON_STYLE["item_separator"], JSON_STYLE["key_separator"])
        try:
            kind = spec.kind
            if kind in ("json_schema", "json_object"):
                schema = spec.json_schema if kind == "json_schema" else {"type": "object"}
                text = schema if isinstance(schema, str) else json.dumps(schema)
                compiled = c.compile_json_schema(text, any_whitespace=False, separators=sep)
            elif kind == "regex":
                compiled = c.compile_regex(spec.regex or "")
            elif kind == "choice":
                options = " | ".join(json.dumps(x, ensure_ascii=False) for x in spec.choice or [])
                compiled = c.compile_grammar(f"root ::= {options}")
            elif kind == "grammar":
                compiled = c.compile_grammar(spec.grammar or "")
            else:
                raise ValueError("tool-call constraints need the llguidance backend")
        except RuntimeError as exc:  # xgrammar reports grammar errors as RuntimeError
            raise ValueError(f"invalid {spec.kind}: {exc}") from None
        return XGrammarMatcher(compiled)

    def fill(self, rows: Sequence[tuple[XGrammarMatcher, int]], bitmask: np.ndarray) -> None:
        target = torch.from_numpy(bitmask)  # shares the array's memory
        for m, i in rows:
            m.m.fill_next_token_bitmask(target, i)

    def encode(self, text: str) -> list[int]:
        return self._hf.encode(text, add_special_tokens=False).ids


class RoutedBackend:
    """xgrammar for JSON Schema, JSON object, regex and choice; llguidance for the rest."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_id: int):
        self.vocab_size = vocab_size
        self.fast = XGrammarBackend(tokenizer, vocab_size, eos_token_id)
        self.general = LLGuidanceBackend(tokenizer, vocab_size, eos_token_id)
        self.encode = self.general.encode

    def compile(self, spec: StructuredOutputs) -> Matcher:
        return (self.fast if spec.kind in ROUTED_KINDS else self.general).compile(spec)

    def fill(self, rows: Sequence[tuple[Any, int]], bitmask: np.ndarray) -> None:
        fast = [(m, i) for m, i in rows if isinstance(m, XGrammarMatcher)]
        if fast:
            self.fast.fill(fast, bitmask)
        if len(fast) < len(rows):
            self.general.fill([(m, i) for m, i in rows if not isinstance(m, XGrammarMatcher)], bitmask)
