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


def balanced_placement(load: torch.Tensor, num_slots: int, world_size: int) -> ExpertPlacement:
    """A placement of `num_slots` slots for logical expert loads `load` [E] (tokens in the window).

    Replication: each redundant slot goes to the expert with the largest load per replica. Placement:
    replicas by decreasing load per replica, each on the rank with free slots and the smallest load so
    far (a rank already holding that expert only when no other has room). Within a rank, slots are
    ordered by logical id. Deterministic: every rank computes the same placement from the same loads.
    """
    n = load.numel()
    if num_slots < n or num_slots % world_size:
        raise ValueError(f"{num_slots} slots for {n} experts on {world_size} ranks")
    w = [float(v) for v in load.double()]
    replicas = [1] * n
    for _ in range(num_slots - n):
        e = max(range(n), key=lambda i: (w[i] / replicas[i], -i))
        replicas[e] += 1
    items = sorted(((w[e] / replicas[e], e) for e in range(n) for _ in range(replicas[e])),
                   key=lambda it: (-it[0], it[1]))
    cap = num_slots // world_size
    rank_load = [0.0] * world_size
    held: list[list[int]] = [[] for _ in range(world_size)]
    for per_replica, e in items:
        free = [r for r in range(world_size) if len(held[r]) < cap]
        fresh = [r for r in free if e not in held[r]] or free
        r = min(fresh, key=lambda i: (rank_load[i], i))
        held[r].append(e)
        rank_load[r] += per_replica
    return ExpertPlacement(tuple(e for r in range(world_size) for e in sorted(held[r])), n, world_size)
