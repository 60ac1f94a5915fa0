"""Incremental detokenization and stop-string matching for one output sequence."""

from __future__ import annotations

import codecs
from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"


class Tokenizer(Protocol):
    """What the engine needs from a tokenizer."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas without ever splitting a UTF-8 character.

    Byte-level tokenizers that expose `byte_pieces()` go through a table of each id's bytes and an
    incremental UTF-8 decoder, which holds back an incomplete character. Others re-decode a short
    window of ids each step: `prefix` ids give context (sentencepiece pieces can change how their
    neighbour renders), ids after `read` are new, and while the window decodes to a trailing U+FFFD
    the last character is incomplete and nothing is emitted.
    Stop strings are matched on the text, so they are found across token boundaries; the last
    `len(longest stop) - 1` characters are held back from streaming until they cannot start a match.
    Only text not yet handed out is kept (as pieces, joined when taken): no per-token copy of the
    whole text.
    """

    def __init__(self, tokenizer: Tokenizer, stop: list[str], include_stop: bool, skip_special: bool):
        self.tokenizer = tokenizer
        self.stop = stop
        self.include_stop = include_stop
        self.skip_special = skip_special
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.ids: list[int] = []
        self._pending: list[str] = []  # text not yet handed out
        self._pending_len = 0
        self._tail = ""  # the last `holdback` characters, where a stop string may have begun
        self._prefix = 0
        self._read = 0
        table = getattr(tokenizer, "byte_pieces", None)
        self._pieces, special = table if table is not None else (None, frozenset())
        self._dropped = special if skip_special else frozenset()
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace").decode

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special)

    def add(self, token_id: int) -> str | None:
        """Append a token; returns the stop string it completed, if any (text is then truncated)."""
        if self._pieces is not None:  # the per-token hot path: one look-up, one incremental decode
            if token_id in self._dropped or token_id >= len(self._pieces):
                return None
            delta = self._utf8(self._pieces[token_id])
            return self._take(delta) if delta else None
        self.ids.append(token_id)
        before = self._decode(self.ids[self._prefix:self._read])
        after = self._decode(self.ids[self._prefix:])
        if len(after) <= len(before) or after.endswith(REPLACEMENT_CHAR):
            return None
        return self._append(after[len(before):])

    def flush(self) -> None:
        """At the end, emit whatever an incomplete trailing character left pending."""
        if self._pieces is not None:
            if delta := self._utf8(b"", final=True):
                self._take(delta)
            return
        before = self._decode(self.ids[self._prefix:self._read])
        after = self._decode(self.ids[self._prefix:])
        if len(after) > len(before):
            self._append(after[len(before):])

    def _append(self, delta: str) -> str | None:
        """Window path: take in newly decoded text and advance the window."""
        self._prefix, self._read = self._read, len(self.ids)
        return self._take(delta)

    def _take(self, delta: str) -> str | None:
        self._pending.append(delta)
        self._pending_len += len(delta)
        return self._match_stop(delta) if self.stop else None

    def _match_stop(self, delta: str) -> str | None:
        """After `delta` joined the pending text: the stop string it completes, text cut before it."""
        window = self._tail + delta  # a match found here ends in `delta`: earlier ones stopped us
        self._tail = window[max(0, len(window) - self.holdback):] if self.holdback else ""
        hits = [(at, s) for s in self.stop if (at := window.find(s)) >= 0]
        if not hits:
            return None
        at, s = min(hits)
        cut = len(window) - (at + (len(s) if self.include_stop else 0))  # never reaches handed-out text
        text = "".join(self._pending)
        self._pending = [text[: len(text) - cut]]
        self._pending_len -= cut
        return s

    def take_delta(self, finished: bool) -> str:
        """Text not yet handed out; while running, keeps back a possible stop-string prefix."""
        keep = 0 if finished else self.holdback
        if self._pending_len <= keep:
            return ""
        text = "".join(self._pending)
        split = len(text) - keep
        self._pending = [text[split:]] if keep else []
        self._pending_len = keep
        return text[:split]
