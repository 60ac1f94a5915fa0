"""Engine calls that a Ctrl-C cannot cut in half.

A SIGINT raises KeyboardInterrupt at whatever bytecode the main thread runs next. Inside the engine
that could be between taking a step off the in-flight queue and reading its result, or halfway
through handing a step's tokens to its sequences: state the next call could never repair. An
`EngineGuard` section serialises engine calls across threads and holds a SIGINT back until the call
has left the engine consistent, then delivers it to the handler that was installed before.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any


class EngineGuard:
    """`with guard:` runs one engine call; reentrant (the same thread may nest calls)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._owner: int | None = None
        self._depth = 0
        self._previous: Any = None
        self._pending = False
        self.on_interrupt: Callable[[], None] | None = None  # run before a held-back SIGINT is delivered

    @property
    def held_by_current_thread(self) -> bool:
        return self._owner == threading.get_ident()

    def __enter__(self) -> EngineGuard:
        # hold SIGINT before waiting for the lock: an interrupt between the two would leave it taken
        previous = None
        if threading.current_thread() is threading.main_thread() and not self.held_by_current_thread:
            previous = signal.signal(signal.SIGINT, self._hold)
        self._lock.acquire()
        self._owner = threading.get_ident()
        self._depth += 1
        if previous is not None:
            self._previous = previous
        return self

    def _hold(self, signum: int, frame: FrameType | None) -> None:
        self._pending = True

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        outermost = self._depth == 0
        deliver = False
        if outermost and self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
            deliver, self._pending = self._pending, False
        if outermost:
            self._owner = None
        callback, self.on_interrupt = (self.on_interrupt, None) if outermost else (None, self.on_interrupt)
        self._lock.release()
        if deliver:
            if callback is not None:
                callback()
            signal.raise_signal(signal.SIGINT)  # the original handler: KeyboardInterrupt by default
