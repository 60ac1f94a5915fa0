"""Physical expert slots of one MoE layer and the EPLB placement policy (official engine §13).

A layer has E logical experts and P >= E physical slots (P a multiple of the ranks), rank r owning
slots [r*P/n, (r+1)*P/n). Each slot holds one logical expert; an expert with several slots (a
redundant replica) has its tokens split over them. The initial placement is logical 0..E-1 in order,
then redundant copies of i mod E. The policy replicates the most loaded experts and places the
replicas greedily on the least loaded rank, which lowers the largest rank load.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch


@dataclass(frozen=True)
class ExpertPlacement:
    slots: tuple[int, ...]  # physical slot -> logical expert
    n_experts: int
    world_size: int

    @classmethod
    @cache  # asked once per checkpoint tensor by the sharded loader
    def initial(cls, n_experts: int, redundant: int, world_size: int) -> ExpertPlacement:
        if n_experts < world_size:
            raise ValueError(f"{n_experts} routed experts cannot be spread over {world_size} ranks")
        total = -(-(n_experts + redundant) // world_size) * world_size
        return cls(tuple(s if s < n_experts else (s - n_experts) % n_experts for s in range(total)),
                   n_experts, world_size)

    @property
    def per_rank(self) -> int:
        return len(self.slots) // self.world_size

    def local_logical(self, rank: int) -> list[int]:
        """Logical expert of each of `rank`'s slots, in slot order."""
        return list(self.slots[rank * self.per_rank : (rank + 1) * self.per_rank])

    def holds(self, rank: int, expert: int) -> bool:
        return expert in self.slots[rank * self.per_rank : (rank + 1) * self.per_rank]

    def replica_table(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(replicas [E, R] slot ids padded with the first replica, count [E]) for routing."""
        lists: list[list[int]] = [[] for _ in range(self.n_experts)]
        for slot, e in enumerate(self.slots):
            lists[e].append(slot)
        width = max(len(r) for r in lists)
        table = torch.tensor([r + [r[0]] * (width - len(r)) for r in lists], dtype=torch.int64, device=device)
        return table, torch.tensor([len(r) for r in lists], dtype=torch.int64, device=device)

    def rank_loads(self, load: torch.Tensor) -> torch.Tensor:
        """Expected tokens per rank [n] when each expert's `load` [E] is split evenly over its replicas."""
        replicas = torch.bincount(torch.tensor(self.slots), minlength=self.n_experts).double()
        per_slot = load.double()[list(self.slots)] / replicas[list(self.slots)]
        return per_slot.view(self.world_size, self.per_rank).sum(-1)


def imbalance(rank_loads: torch.Tensor) -> float:
    """max / mean tokens per rank (1.0 = perfectly balanced; the official `moe_lb` statistic)."""
    mean = float(rank_loads.double().mean())
    return float(rank_loads.max()) / mean if mean > 0 else 1.0


def balanced_placement(loads: torch.Tensor, num_slots: int, world_size: int) -> ExpertPlacement:
    """A placement of `num_slots` slots from the window's logical expert loads `loads` [steps, E]
    (tokens per step; [E] counts as one step).

    Peak-aware, as the official policy: each redundant slot goes to the expert whose extra replica
    lowers most the sum over steps of the largest per-replica load; then replicas, by decreasing mean
    load, each go to the rank with free slots whose choice gives the smallest sum over steps of the
    largest rank load (a rank already holding that expert only when no other has room). Ties: the
    larger load per replica, the less loaded rank, the lower index. Within a rank, slots are ordered
    by logical id. Deterministic: every rank computes the same placement from the same loads.
    """
    series = loads.double().reshape(-1, loads.shape[-1])
    n = series.shape[1]
    if num_slots < n or num_slots % world_size:
        raise ValueError(f"{num_slots} slots for {n} experts on {world_size} ranks")
    replicas = torch.ones(n, dtype=torch.float64)
    for _ in range(num_slots - n):
        per_replica = series / replicas
        e = _best(_peak_sums(per_replica, series / (replicas + 1)), -per_replica.mean(0))
        replicas[e] += 1
    per_replica = series / replicas
    items = sorted(((float(per_replica[:, e].mean()), e) for e in range(n) for _ in range(int(replicas[e]))),
                   key=lambda it: (-it[0], it[1]))
    cap = num_slots // world_size
    rank_load = torch.zeros(series.shape[0], world_size, dtype=torch.float64)
    held: list[list[int]] = [[] for _ in range(world_size)]
    for _, e in items:
        free = [r for r in range(world_size) if len(held[r]) < cap]
        allowed = [r for r in free if e not in held[r]] or free
        peaks = _peak_sums(rank_load, rank_load + per_replica[:, e : e + 1])
        blocked = torch.full((world_size,), torch.inf, dtype=torch.float64)
        blocked[allowed] = 0
        r = _best(peaks + blocked, rank_load.sum(0))
        held[r].append(e)
        rank_load[:, r] += per_replica[:, e]
    return ExpertPlacement(tuple(e for r in range(world_size) for e in sorted(held[r])), n, world_size)


def _peak_sums(current: torch.Tensor, changed: torch.Tensor) -> torch.Tensor:
    """For each column c of current [S, C]: the sum over rows of the row maximum once column c alone is
    replaced by changed[:, c]."""
    top = current.topk(min(2, current.shape[1]), dim=1)
    best, arg = top.values[:, 0:1], top.indices[:, 0:1]
    second = top.values[:, -1:] if current.shape[1] > 1 else torch.full_like(best, -torch.inf)
    others = torch.where(torch.arange(current.shape[1]) == arg, second, best)  # max of the other columns
    return torch.maximum(others, changed).sum(0)


def _best(objective: torch.Tensor, tie_break: torch.Tensor) -> int:
    """Index with the smallest objective; among equal ones the smallest tie_break, then the lowest."""
    ties = objective == objective.min()
    return int(torch.where(ties, tie_break, torch.inf).argmin())
