"""Expert parallelism for one MoE layer: route locally, dispatch pairs to the experts' ranks, combine.

Every rank computes the router for its own tokens (the router is replicated), so selection and weights
are exactly the single-process ones. The (token, expert) pairs, in the reference's accumulation order
(by logical expert, tokens ascending), go to the rank of the physical slot chosen for them; each rank
runs its local experts on what each rank sent with the reference expert math, sends the per-pair
outputs back, and the source adds them into float32 token sums in that same order: the sum is the single
process's sum. The shared expert runs locally. A rank without tokens still joins every exchange.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from deepinfer.distributed.comm import exchange_counts, exchange_rows
from deepinfer.distributed.placement import ExpertPlacement
from deepinfer.ops import Ops
from deepinfer.ops.reference.moe import ReferenceExperts, route, routed_experts, swiglu_clamped
from deepinfer.ops.weights import MoEWeights

EXPERT_KEYS = ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale")
LOAD_WINDOW = 100  # steps of expert-load statistics kept (DEEPINFER_EXPERT_COUNT_WINDOW_SIZE)


@dataclass
class CommStats:
    """Bytes this rank sent to other ranks and the tokens it routed (for bytes per token per layer)."""

    bytes_sent: int = 0
    tokens: int = 0


@dataclass
class ExpertParallel:
    """The expert-parallel part of one MoE layer on one rank."""

    placement: ExpertPlacement
    rank: int
    group: dist.ProcessGroup | None
    stacks: dict[str, torch.Tensor]  # this rank's slots as given to prepare_experts (EPLB moves them)
    loads: deque[torch.Tensor] = field(default_factory=lambda: deque(maxlen=LOAD_WINDOW))  # [E] per step
    received: deque[int] = field(default_factory=lambda: deque(maxlen=LOAD_WINDOW))  # pairs computed here
    comm: CommStats = field(default_factory=CommStats)

    def __post_init__(self) -> None:
        self.set_placement(self.placement)

    def set_placement(self, placement: ExpertPlacement) -> None:
        self.placement = placement
        self._replicas = placement.replica_table(torch.device("cpu"))

    def __call__(self, x: torch.Tensor, layer: MoEWeights, ops: Ops, image_mask: torch.Tensor | None
                 ) -> torch.Tensor:
        if not isinstance(layer.experts, ReferenceExperts):
            raise TypeError(f"expert parallelism computes experts with the reference expert math; the "
                            f"backend prepared {type(layer.experts).__name__}")
        weights, ids = route(x, layer, image_mask)
        routed = self._routed(x.to(layer.dtype), weights, ids, layer)
        dt = layer.dtype
        act = swiglu_clamped(ops.linear(x, layer.shared_w1, dt), ops.linear(x, layer.shared_w3, dt),
                             layer.swiglu_limit)
        return routed.to(dt) + ops.linear(act.to(dt), layer.shared_w2, dt)

    def _routed(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, layer: MoEWeights
                ) -> torch.Tensor:
        """Float32 sums [T, H] of the routed experts' outputs: dispatch, compute, combine."""
        flat = ids.flatten()
        order = flat.argsort(stable=True)  # the reference's accumulation order
        tokens = order // ids.shape[1]
        counts = torch.bincount(flat, minlength=self.placement.n_experts)
        self.loads.append(counts.cpu())
        slot = self._slots(flat[order], counts)
        per_rank = self.placement.per_rank
        dest = slot // per_rank
        send_order = dest.argsort(stable=True)  # pairs grouped by destination rank
        send_t = torch.bincount(dest, minlength=self.placement.world_size)
        send = send_t.tolist()
        recv = exchange_counts(send_t, self.group)
        xs = x.index_select(0, tokens[send_order])
        meta = torch.stack((weights.flatten()[order], (slot % per_rank).float()), -1)[send_order]
        xr = exchange_rows(xs, send, recv, self.group)
        mr = exchange_rows(meta, send, recv, self.group)
        self.received.append(xr.shape[0])
        # one expert pass per source rank: its rows form the same expert groups as in a single process,
        # so results do not depend on what other ranks send in the same step
        y = torch.cat([routed_experts(xs_r, m_r[:, :1], m_r[:, 1:].long(), layer.experts, layer.swiglu_limit)
                       for xs_r, m_r in zip(xr.split(recv), mr.split(recv))])
        back = exchange_rows(y, recv, send, self.group)
        row = x.shape[1] * x.element_size()  # a dispatched row, and an output sent back
        self.comm.bytes_sent += ((sum(send) - send[self.rank]) * (row + meta.shape[1] * meta.element_size())
                                 + (sum(recv) - recv[self.rank]) * row)
        self.comm.tokens += x.shape[0]
        pairs = torch.empty_like(back)
        pairs[send_order] = back  # back in the accumulation order
        return torch.zeros(x.shape, dtype=torch.float32, device=x.device).index_add_(0, tokens, pairs.float())

    def _slots(self, logical: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Physical slot of each pair (pairs sorted by logical expert): an expert's pairs go round-robin
        over its replicas."""
        table, n_rep = (t.to(logical.device) for t in self._replicas)
        start = counts.cumsum(0) - counts
        j = torch.arange(logical.numel(), device=logical.device) - start[logical]
        return table[logical, j % n_rep[logical]]
