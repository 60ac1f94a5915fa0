"""EPLB rebalancing: gather the expert loads of the window, compute a balanced placement, move weights.

Runs on all ranks at the same point between forwards (a collective sequence). Loads are the per-step
logical expert counts every rank recorded for its own tokens, summed over ranks. Expert weights move in their
storage form (packed FP4 and scales) with point-to-point sends from the lowest rank that held the
expert; a rank keeps what it already has. Outputs do not change: the same experts compute the same
pairs, only on other ranks.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist

from deepinfer.distributed.expert_parallel import EXPERT_KEYS, ExpertParallel
from deepinfer.distributed.placement import ExpertPlacement, balanced_placement, imbalance
from deepinfer.models.deepseek_v41.model import DeepseekV41Model
from deepinfer.models.deepseek_v41.moe import MoE


def rebalance(model: DeepseekV41Model, group: dist.ProcessGroup | None) -> list[tuple[float, float]]:
    """Rebalance every expert-parallel layer -> (imbalance before, after) per layer, from the window."""
    result = []
    for blk in model.blocks:
        ep = blk.moe.ep
        if ep is None:
            continue
        # every rank recorded one entry per forward of the same steps (lock-step)
        steps = list(ep.loads) or [torch.zeros(ep.placement.n_experts)]
        series = torch.stack(steps).double()
        dist.all_reduce(series, group=group)
        load = series.sum(0)
        old = ep.placement
        new = balanced_placement(series, len(old.slots), old.world_size)
        if new != old:
            move_experts(blk.moe, new, group)
        result.append((imbalance(old.rank_loads(load)), imbalance(new.rank_loads(load))))
        ep.loads.clear()
        ep.received.clear()
    return result


def move_experts(moe: MoE, new: ExpertPlacement, group: dist.ProcessGroup | None) -> None:
    """Give this rank the experts of its slots under `new`, receiving those it lacks."""
    ep: ExpertParallel = moe.ep  # type: ignore[assignment]
    old, me = ep.placement, ep.rank
    held = [old.local_logical(r) for r in range(old.world_size)]
    source: dict[int, int] = {}
    for r, experts in enumerate(held):
        for e in experts:
            source.setdefault(e, r)
    sizes = [ep.stacks[k][0].nbytes for k in EXPERT_KEYS]

    def packed(e: int) -> torch.Tensor:
        i = held[me].index(e)
        return torch.cat([ep.stacks[k][i].reshape(-1).view(torch.uint8) for k in EXPERT_KEYS])

    requests = []
    for r in range(old.world_size):
        for slot, e in enumerate(new.local_logical(r)):
            if r != me and e not in held[r] and source[e] == me:
                requests.append(dist.isend(packed(e), r, group, tag=slot))
    incoming: dict[int, torch.Tensor] = {}
    for slot, e in enumerate(new.local_logical(me)):
        if e not in held[me]:
            incoming[slot] = torch.empty(sum(sizes), dtype=torch.uint8)
            requests.append(dist.irecv(incoming[slot], source[e], group, tag=slot))
    for req in requests:
        req.wait()

    parts: dict[str, list[torch.Tensor]] = {k: [] for k in EXPERT_KEYS}
    for slot, e in enumerate(new.local_logical(me)):
        if slot in incoming:
            for k, chunk in zip(EXPERT_KEYS, incoming[slot].split(sizes)):
                ref = ep.stacks[k][0]
                parts[k].append(chunk.view(ref.dtype).view(ref.shape))
        else:
            for k in EXPERT_KEYS:
                parts[k].append(ep.stacks[k][held[me].index(e)])
    ep.stacks = {k: torch.stack(v) for k, v in parts.items()}
    moe.weights = replace(moe.weights, experts=moe.ops.prepare_experts(**ep.stacks))
    ep.set_placement(new)
