"""The contract between the engine and a model runtime.

The engine (scheduler, cache manager, model runner) only talks to models through these types, so a
model family can change its internals, and the engine can be tested, without either knowing the other.
One forward call runs a batch of sequence segments: each segment is a run of new tokens of one
sequence (a prefill chunk, one decode token, or several verification tokens) appended after the
tokens that sequence already has in its cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch

LogitsWanted = Literal["none", "last", "all"]


@dataclass(frozen=True)
class CacheLayout:
    """Bytes the model needs per paged block and per sequence state slot, for sizing the pools."""

    block_size: int  # raw tokens per paged block
    bytes_per_block: int
    bytes_per_slot: int


@dataclass
class SequenceSegment:
    """New tokens of one sequence in one forward call."""

    slot: int  # per-sequence state slot (SWA rings, compressor partial groups)
    block_table: list[int]  # paged block ids covering positions [0, start_pos + len(token_ids))
    start_pos: int  # tokens of this sequence already in the cache (= position of token_ids[0])
    token_ids: list[int]
    logits: LogitsWanted = "last"


@dataclass
class ForwardBatch:
    """Segments to run. `input_ids`, when given, is the authoritative token values; the lists then only
    give each segment's length (and positions).

    Under async scheduling a sequence's newest token may still be on the device when the next step is
    launched: the engine then passes `input_ids` ([sum of segment lengths], int64, on the model's
    device, segments in order) whose entries were written on the device from the previous step's
    sampled tokens, and the matching list entries are stand-ins (negative, never a real id). A model
    must then read every token value it needs (embedding, n-gram history, ...) from `input_ids`, never
    from the lists, so that launching a step needs no device-to-host copy of the step before.
    """

    segments: list[SequenceSegment]
    input_ids: torch.Tensor | None = None


@dataclass
class ForwardOutput:
    """Logits rows in segment order: one row per segment with "last", len(token_ids) with "all"."""

    logits: torch.Tensor  # [rows, vocab], float32
    row_offsets: list[int] = field(default_factory=list)  # first row of each segment (len = segments + 1)


class CausalLM(Protocol):
    """What the engine needs from a model runtime."""

    vocab_size: int
    eos_token_id: int
    # Rollback of rejected tokens is free: the next segment simply starts at a smaller start_pos,
    # at most this many tokens back from the furthest position written.
    max_backtrack: int

    def cache_layout(self) -> CacheLayout: ...

    def allocate_cache(self, num_blocks: int, num_slots: int) -> None:
        """Allocate the paged pool (block 0 reserved as padding) and the state slots (slot 0 padding)."""

    def forward(self, batch: ForwardBatch) -> ForwardOutput: ...

    def reset_slot(self, slot: int) -> None:
        """Clear a slot's state before it is handed to a new sequence."""
