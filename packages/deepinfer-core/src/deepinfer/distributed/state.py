"""The parallel layout of this process: its rank, the group, which experts and Engram rows it holds.

Layout (model spec §9.5, official engine §2/§14): every rank is one data-parallel engine; the routed
experts of the backbone MoE layers are sharded over the same ranks (ep = dp = world size) and the
Engram tables are row-sharded over them; everything else (attention, shared experts, router, heads,
DSpark) is replicated. While a state is active (`use_parallel`), loading a checkpoint reads only this
rank's share and the MoE / Engram layers built from it exchange tokens and rows with the other ranks.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch.distributed as dist

from deepinfer.distributed.engram_shard import EngramShard
from deepinfer.distributed.placement import ExpertPlacement

# routed-expert tensors of backbone layers (DSpark `mtp.*` experts stay replicated: they are small and
# the draft model then runs on each rank without collectives)
_BACKBONE_EXPERT = re.compile(r"^layers\.(\d+)\.ffn\.experts\.(\d+)\.")
_ENGRAM_TABLE = re.compile(r"^layers\.\d+\.engram\.embed\.(weight|scale)$")


@dataclass
class ParallelState:
    rank: int
    world_size: int
    group: dist.ProcessGroup | None  # None: the default group
    redundant_experts: int = 0  # EPLB: extra physical expert slots (rounded up to a multiple of the ranks)

    def placement(self, n_experts: int) -> ExpertPlacement:
        """The initial placement of a layer with `n_experts` logical experts."""
        return ExpertPlacement.initial(n_experts, self.redundant_experts, self.world_size)

    def engram_shard(self, total: int) -> EngramShard:
        """This rank's share of an Engram table of `total` rows: equal contiguous blocks of rows."""
        per = -(-total // self.world_size)
        return EngramShard(min(self.rank * per, total), per, self.world_size, self.group)

    def engram_rows(self, total: int) -> tuple[int, int]:
        """[begin, end) of the Engram table rows this rank holds."""
        shard = self.engram_shard(total)
        return shard.begin, min(shard.begin + shard.per_rank, total)

    def keeps_expert(self, name: str, n_experts: int) -> bool:
        """Whether this rank loads checkpoint tensor `name` if it is a backbone routed-expert tensor."""
        m = _BACKBONE_EXPERT.match(name)
        return m is None or self.placement(n_experts).holds(self.rank, int(m.group(2)))

    def row_range(self, name: str, total: int) -> tuple[int, int] | None:
        """This rank's row range of an Engram table tensor, None for every other tensor."""
        return self.engram_rows(total) if _ENGRAM_TABLE.match(name) else None


def shards_experts(prefix: str) -> bool:
    """Whether the MoE under weight prefix `prefix` ("layers.3.ffn.") has expert-parallel experts."""
    return _BACKBONE_EXPERT.match(prefix + "experts.0.") is not None


_active: ParallelState | None = None


def parallel_state() -> ParallelState | None:
    """The active layout, None in a single-process run (or with one rank)."""
    return _active


@contextmanager
def use_parallel(state: ParallelState | None) -> Iterator[ParallelState | None]:
    """Make `state` the layout of this process while loading and running a model."""
    global _active
    previous, _active = _active, state if state is not None and state.world_size > 1 else None
    try:
        yield _active
    finally:
        _active = previous
