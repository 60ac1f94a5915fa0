"""Keeping data-parallel ranks in step: every forward of every rank runs the same exchanges.

Each rank serves its own requests, but the MoE and Engram exchanges are collectives, so all ranks must
run the same number of forwards. Every real forward starts with a tick (an all-reduce of "I have
work"); a rank whose work is done calls `drain`, which ticks "idle" and runs a dummy forward (zero
tokens through every exchange, in forward order) for as long as any other rank still works, then all
ranks leave together. EPLB rebalancing, when enabled, runs every `eplb_interval` ticks: the tick count
is the same on every rank, so all ranks rebalance at the same point.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from deepinfer.distributed.eplb import rebalance
from deepinfer.models.deepseek_v41.model import DeepseekV41Model


def dummy_forward(model: DeepseekV41Model) -> None:
    """Zero tokens through every collective of a forward (Engram row fetches, MoE exchanges), in order."""
    cfg = model.cfg
    x = torch.zeros(0, cfg.hidden_size, dtype=model.dtype, device=model.embed.device)
    for blk in model.blocks:
        if blk.engram is not None and blk.engram.shard is not None:
            heads = (cfg.engram_max_ngram_size - 1) * cfg.engram_n_heads
            rows = torch.zeros(0, heads, dtype=torch.int64, device=x.device)
            blk.engram.shard.gather(blk.engram.table, blk.engram.table_scale, rows)
        blk.moe(x)


class LockStep:
    def __init__(self, model: DeepseekV41Model, group: dist.ProcessGroup | None, eplb_interval: int = 0):
        self.model, self.group, self.eplb_interval = model, group, eplb_interval
        self.ticks = 0
        self.dummy_forwards = 0
        self.rebalances: list[list[tuple[float, float]]] = []  # per rebalance: (before, after) per layer

    def attach(self, runtime: Any) -> None:
        """Tick before each of `runtime`'s forwards (also those its own `score` makes)."""
        forward: Callable = runtime.forward

        def ticked(batch: Any) -> Any:
            self._tick(True)
            return forward(batch)

        runtime.forward = ticked

    def drain(self) -> None:
        """Run dummy forwards until no rank has work left (every rank calls this once it is done)."""
        while self._tick(False):
            dummy_forward(self.model)
            self.dummy_forwards += 1

    def _tick(self, active: bool) -> bool:
        """All-reduce the work flags -> whether any rank is working in this round."""
        flag = torch.tensor([int(active)], dtype=torch.int64)
        dist.all_reduce(flag, group=self.group)
        self.ticks += 1
        if self.eplb_interval and self.ticks % self.eplb_interval == 0:
            self.rebalances.append(rebalance(self.model, self.group))
        return bool(flag.item())
