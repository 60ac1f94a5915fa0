"""The seam between the engine and a grammar library: compile a constraint for a vocabulary, then per
sequence a matcher that accepts tokens, rolls back and fills its row of the token bitmask.

A bitmask row has `ceil(V / 32)` int32 words; bit `t % 32` of word `t // 32` set = token t allowed
(the layout xgrammar and llguidance share). `llguidance_backend.LLGuidanceBackend` is the default; a
backend for another library implements these two protocols.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from deepinfer.sampling.params import StructuredOutputs


class Matcher(Protocol):
    """One sequence's position in a grammar."""

    def accept(self, token: int) -> bool:
        """Advance by `token`; False (and an error) if the grammar does not allow it."""
        ...

    def rollback(self, n: int) -> None:
        """Undo the last `n` accepted tokens."""
        ...

    def error(self) -> str | None:
        """Why the matcher cannot go on (a rejected token, a resource limit), else None."""
        ...

    def fork(self) -> Matcher:
        """An independent copy in the same state."""
        ...


class Backend(Protocol):
    vocab_size: int  # bitmask width in tokens (the model's logits width)

    def compile(self, spec: StructuredOutputs) -> Matcher:
        """A matcher at the start of `spec`'s grammar (sequences fork it). May take long (run it off the
        step loop); raises ValueError naming what is wrong with the grammar."""
        ...

    def fill(self, rows: Sequence[tuple[Matcher, int]], bitmask: np.ndarray) -> None:
        """Write each matcher's allowed next tokens into its row of `bitmask` [R, W] int32."""
        ...

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, special tokens included (trigger sequences such as `</think>`)."""
        ...
