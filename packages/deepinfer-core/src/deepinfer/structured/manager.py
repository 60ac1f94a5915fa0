"""Per-sequence grammar state and the token bitmask of each step.

The model runner calls `apply` on its worker thread right before sampling, after the step's forward was
launched: on an accelerator the CPU fills the step's bitmask while the device runs the forward, and
one op (`apply_token_bitmask`) masks the logits. A sequence's grammar state catches up there with the
tokens it sampled since its last row (the newest may still be in flight: `latest` reads the previous
step's host copy, which never waits for the current forward).

Phases of a constrained sequence:
* waiting for its trigger (`start_after`, e.g. `</think>`): generation is free, the row is all ones;
* constrained: the matcher (forked from the compiled grammar) fills the row;
* ended at a known position: the grammar finished (its row allowed only EOS) or failed (compile error
  or timeout, a rejected token, no token left): the row allows only EOS and `finish_reason` reports
  "stop" or "grammar_error" for the token sampled there.

Compilation starts when the request is added (`prepare`), on a small thread pool, with a cache keyed
by the constraint; the scheduler admits the request once it is compiled (`admissible`), or once
`timeout` seconds have passed since its arrival (its first row then ends it), so only that request
waits. State survives preemption (recompute
only replays known tokens) and is dropped once the sequence has finished. `rollback` and `draft_rows`
serve speculative decoding (a row per verified position; undo rejected tokens).
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import numpy as np
import torch

from deepinfer.engine.sequence import SeqStatus
from deepinfer.engine.sequence import Sequence as Seq
from deepinfer.ops import Ops, get_ops
from deepinfer.sampling.params import SamplingParams, StructuredOutputs
from deepinfer.sampling.sampler import to_device
from deepinfer.structured.backend import Backend, Matcher

GRAMMAR_ERROR = "grammar_error"
CACHE_ENTRIES = 256


class _State:
    """One sequence's progress through its constraint."""

    __slots__ = ("compiled", "deadline", "end", "end_pos", "history", "matcher", "seq", "start", "trigger")

    def __init__(self, seq: Seq, compiled: Future[Matcher], trigger: list[int], deadline: float):
        self.seq = seq
        self.compiled = compiled
        self.trigger = trigger
        self.deadline = deadline
        self.history: list[int] = []  # output tokens consumed
        self.start: int | None = None if trigger else 0  # history index where the grammar begins
        self.matcher: Matcher | None = None
        self.end: tuple[str, str] | None = None  # (finish reason, why) once the constraint has ended
        self.end_pos: int | None = None  # position of the EOS-only row that ends the sequence

    def ended(self, reason: str, why: str) -> None:
        if self.end is None:
            self.end = (reason, why)


class StructuredManager:
    """`tokenizer`: the engine's (None: constrained requests are refused); `backend_factory` builds the
    grammar backend on the first constrained request (the vocabulary trie: 1-5 s on 129k tokens, on
    the thread that adds the request)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_id: int | None,
                 backend_factory: Callable[[Any, int, int], Backend] | None = None,
                 timeout: float | None = None):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.words = (vocab_size + 31) // 32
        self.timeout = timeout if timeout is not None else float(
            os.environ.get("DEEPINFER_STRUCTURED_TIMEOUT", "20"))
        self._factory = backend_factory
        self._backend: Backend | None = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, Future[Matcher]] = OrderedDict()
        self._pool: ThreadPoolExecutor | None = None
        self._states: dict[int, _State] = {}
        self._eos_row = np.zeros(self.words, dtype=np.int32)
        if eos_token_id is not None:
            self._eos_row.view(np.uint32)[eos_token_id // 32] = 1 << (eos_token_id % 32)

    # ---- request time (engine thread) -----------------------------------------------------------

    @property
    def backend(self) -> Backend:
        with self._lock:
            if self._backend is None:
                if self.tokenizer is None:
                    raise ValueError("structured output needs a tokenizer; this engine has none")
                if self.eos_token_id is None:
                    raise ValueError("structured output needs the model's EOS token id")
                factory = self._factory or default_backend_factory()
                self._backend = factory(self.tokenizer, self.vocab_size, self.eos_token_id)
            return self._backend

    def prepare(self, params: SamplingParams) -> None:
        """Check a request's constraint against this engine and start compiling it; ValueError if it
        cannot be served."""
        spec = params.structured_outputs
        if spec is None:
            return
        if spec.start_after is not None and not self.backend.encode(spec.start_after):
            raise ValueError(f"start_after {spec.start_after!r} encodes to no tokens")
        self._compiled(spec)

    def _compiled(self, spec: StructuredOutputs) -> Future[Matcher]:
        backend = self.backend
        key = spec.model_dump_json(exclude={"start_after"})
        with self._lock:
            fut = self._cache.get(key)
            if fut is None or (fut.done() and fut.exception() is not None):
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(2, thread_name_prefix="deepinfer-grammar")
                fut = self._pool.submit(backend.compile, spec)
                self._cache[key] = fut
                while len(self._cache) > CACHE_ENTRIES:
                    self._cache.popitem(last=False)
            self._cache.move_to_end(key)
            return fut

    def admissible(self, seq: Seq) -> bool:
        """Whether the scheduler may start `seq`: its grammar is compiled, or waiting for it timed out
        (then its first row ends it with "grammar_error"). Other requests run meanwhile."""
        spec = seq.request.params.structured_outputs
        if spec is None:
            return True
        return self._compiled(spec).done() or time.time() >= seq.request.arrival_time + self.timeout

    def finish_reason(self, seq: Seq) -> str | None:
        """"stop" or "grammar_error" when the token just appended to `seq` ends it by its constraint."""
        st = self._states.get(seq.seq_id)
        if st is None or st.end is None or st.end_pos != len(seq.token_ids) - 1:
            return None
        return st.end[0]

    # ---- step time (worker thread) --------------------------------------------------------------

    def apply(self, logits: torch.Tensor, seqs: Sequence[Seq], positions: Sequence[int],
              latest: Callable[[Seq], int], ops: Ops | None = None) -> torch.Tensor:
        """`logits` [R, V] for sampling rows of `seqs` at `positions`, masked by their constraints
        (`ops`: the sampler's op set, default the logits device's)."""
        mask = self.fill(seqs, positions, latest)
        if mask is None:
            return logits
        ops = ops or get_ops(device=logits.device)
        rows = [i for i, s in enumerate(seqs) if s.request.params.structured_outputs is not None]
        if len(rows) == len(seqs):
            return ops.apply_token_bitmask(logits, _to_device(mask, logits.device))
        idx = to_device(rows, logits.device)  # mask only the constrained rows
        masked = ops.apply_token_bitmask(logits.index_select(0, idx), _to_device(mask[rows], logits.device))
        return logits.index_copy(0, idx, masked)

    def fill(self, seqs: Sequence[Seq], positions: Sequence[int],
             latest: Callable[[Seq], int]) -> np.ndarray | None:
        """The step's bitmask [R, W] int32 (all ones on free rows); None when no row is constrained."""
        self._drop_finished()
        mask: np.ndarray | None = None
        rows: list[tuple[Matcher, int]] = []
        states: list[_State | None] = [None] * len(seqs)
        for i, (seq, pos) in enumerate(zip(seqs, positions, strict=True)):
            spec = seq.request.params.structured_outputs
            if spec is None:
                continue
            if mask is None:
                mask = np.full((len(seqs), self.words), -1, dtype=np.int32)
            st = states[i] = self._state(seq, spec)
            self._catch_up(st, seq, pos, latest)
            matcher = self._active(st)
            if matcher is not None:
                rows.append((matcher, i))
        if mask is not None and rows:
            self.backend.fill(rows, mask)
        for i, st in enumerate(states):
            if st is not None:
                self._finish_row(st, mask[i], positions[i])  # type: ignore[index]
        return mask

    def draft_rows(self, seq: Seq, position: int, drafts: Sequence[int],
                   latest: Callable[[Seq], int]) -> np.ndarray:
        """Speculation: the rows verifying `drafts` at positions `position`, `position` + 1, ...: row j is
        the mask after drafts[:j] ([1 + len(drafts), W]). Rows after the first draft the grammar rejects
        stay all ones (verification stops there). The grammar state is left as it was."""
        out = np.full((1 + len(drafts), self.words), -1, dtype=np.int32)
        spec = seq.request.params.structured_outputs
        if spec is None:
            return out
        st = self._state(seq, spec)
        self._catch_up(st, seq, position, latest)
        taken = 0
        for j in range(len(drafts) + 1):
            matcher = self._active(st)
            if matcher is not None:
                self.backend.fill([(matcher, j)], out)
            self._finish_row(st, out[j], position + j)
            if j == len(drafts) or st.end is not None or not _allowed(out[j], drafts[j]):
                break
            self._feed(st, drafts[j])
            taken += 1
        self.rollback(seq.seq_id, taken)
        return out

    def rollback(self, seq_id: int, n: int) -> None:
        """Forget the last `n` tokens `seq_id`'s constraint consumed (rejected drafts)."""
        st = self._states.get(seq_id)
        if st is None or n == 0:
            return
        keep = len(st.history) - n
        if st.end is None and st.start is not None and st.start <= keep and st.matcher is not None:
            st.matcher.rollback(n)
            del st.history[keep:]
            return
        replay = st.history[:keep]  # the trigger or the end is undone: replay from the start
        st.history, st.matcher, st.end, st.end_pos = [], None, None, None
        st.start = None if st.trigger else 0
        for token in replay:
            self._feed(st, token)

    # ---- internals ------------------------------------------------------------------------------

    def _state(self, seq: Seq, spec: StructuredOutputs) -> _State:
        st = self._states.get(seq.seq_id)
        if st is None:
            trigger = self.backend.encode(spec.start_after) if spec.start_after else []
            st = _State(seq, self._compiled(spec), trigger, seq.request.arrival_time + self.timeout)
            self._states[seq.seq_id] = st
        return st

    def _drop_finished(self) -> None:
        for sid in [sid for sid, st in self._states.items() if st.seq.status is SeqStatus.FINISHED]:
            del self._states[sid]

    def _catch_up(self, st: _State, seq: Seq, position: int, latest: Callable[[Seq], int]) -> None:
        """Feed the output tokens before `position` that the state has not seen."""
        have, want = len(st.history), position - seq.prompt_len
        if have >= want:
            return
        new = seq.token_ids[seq.prompt_len + have:position]
        if len(new) < want - have:  # the newest token is still in flight
            new = [*new, latest(seq)]
        for token in new:
            self._feed(st, token)

    def _feed(self, st: _State, token: int) -> None:
        st.history.append(token)
        if st.end is not None:
            return
        if st.start is None:  # free until the trigger's tokens have appeared
            if st.history[-len(st.trigger):] == st.trigger:
                st.start = len(st.history)
            return
        matcher = self._active(st)
        if matcher is not None and not matcher.accept(token):
            st.ended(GRAMMAR_ERROR, f"token {token} rejected: {matcher.error()}")
        elif token == self.eos_token_id:  # the grammar took its end (async: a row was planned after it)
            st.ended("stop", "the grammar is complete")

    def _active(self, st: _State) -> Matcher | None:
        """The matcher once the grammar applies (waiting for the compile, bounded by the deadline)."""
        if st.start is None or st.end is not None:
            return None
        if st.matcher is None:
            try:
                st.matcher = st.compiled.result(timeout=max(0.0, st.deadline - time.time())).fork()
            except FutureTimeout:
                st.ended(GRAMMAR_ERROR, f"grammar compile took over {self.timeout:g} s")
            except ValueError as exc:
                st.ended(GRAMMAR_ERROR, str(exc))
        return st.matcher if st.end is None else None

    def _finish_row(self, st: _State, row: np.ndarray, position: int) -> None:
        """Judge a filled row: nothing allowed is a dead end; only EOS allowed completes the grammar.
        An ended constraint's row allows only EOS, and the token sampled there ends the sequence."""
        if st.end is None and st.start is not None:
            if not row.any():
                st.ended(GRAMMAR_ERROR, "no token can continue the grammar")
            elif np.array_equal(row, self._eos_row):
                st.ended("stop", "the grammar is complete")
        if st.end is not None:
            row[:] = self._eos_row
            if st.end_pos is None:
                st.end_pos = position


def default_backend_factory() -> Callable[[Any, int, int], Backend]:
    """`DEEPINFER_STRUCTURED_BACKEND`: "llguidance" (the default) or "xgrammar" (xgrammar for JSON,
    regex and choice, llguidance for the rest: needs the xgrammar package)."""
    name = os.environ.get("DEEPINFER_STRUCTURED_BACKEND", "llguidance")
    if name == "llguidance":
        from deepinfer.structured.llguidance_backend import LLGuidanceBackend

        return LLGuidanceBackend
    if name == "xgrammar":
        try:
            from deepinfer.structured.xgrammar_backend import RoutedBackend
        except ImportError as exc:
            raise ValueError(f"DEEPINFER_STRUCTURED_BACKEND=xgrammar needs the xgrammar package ({exc})"
                             ) from None
        return RoutedBackend
    raise ValueError(f"DEEPINFER_STRUCTURED_BACKEND must be llguidance or xgrammar, got {name!r}")


def _to_device(mask: np.ndarray, device: torch.device) -> torch.Tensor:
    """The host bitmask on `device` (pinned and non-blocking on CUDA: queued behind the forward)."""
    host = torch.from_numpy(np.ascontiguousarray(mask))
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def _allowed(row: np.ndarray, token: int) -> bool:
    return bool((int(row[token // 32]) >> (token % 32)) & 1)
