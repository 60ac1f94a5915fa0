"""Expert parallelism for one MoE layer: route locally, dispatch pairs to the experts' ranks, combine.

Every rank computes the router for its own tokens (the router is replicated), so selection and weights
are exactly the single-process ones. The (token, expert) pairs, in the reference's accumulation order
(by logical expert, tokens ascending), go to the rank of the physical slot chosen for them: a token's
row travels once per destination rank, with (weight, local slot, row) per pair, while the shared
expert runs locally. Each rank runs its local experts on what each rank sent with the reference
expert math and sends the per-pair outputs back; the source adds them into float32 token sums in that
same order, so the sum is the single process's sum. A rank without tokens still joins every exchange."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from deepinfer.distributed.comm import PendingRows, exchange_counts, exchange_rows, start_exchange
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
class _Dispatch:
    """A step's pairs between dispatch and combine."""

    tokens: torch.Tensor  # [P] token of each pair, pairs in the accumulation order
    send_order: torch.Tensor  # [P] the pairs grouped by destination rank
    send_pairs: list[int]  # per rank: pairs sent to it
    recv_rows: list[int]  # per rank: distinct token rows it sent here
    recv_pairs: list[int]
    shape: torch.Size  # [T, H] of the tokens
    rows: PendingRows
    meta: PendingRows  # per pair: routing weight, local slot, row within its source's rows


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
        dispatch = self._dispatch(x.to(layer.dtype), weights, ids)
        dt = layer.dtype  # the shared expert runs while the dispatched rows are in flight
        act = swiglu_clamped(ops.linear(x, layer.shared_w1, dt), ops.linear(x, layer.shared_w3, dt),
                             layer.swiglu_limit)
        shared = ops.linear(act.to(dt), layer.shared_w2, dt)
        return self._combine(dispatch, layer).to(dt) + shared

    def _dispatch(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> _Dispatch:
        """Start sending each (token, destination rank) row once, and per pair its routing weight,
        local slot and row."""
        t, k = ids.shape
        world, per_rank = self.placement.world_size, self.placement.per_rank
        flat = ids.flatten()
        order = flat.argsort(stable=True)  # the reference's accumulation order
        tokens = order // k
        counts = torch.bincount(flat, minlength=self.placement.n_experts)
        self.loads.append(counts.cpu())
        slot = self._slots(flat[order], counts)
        dest = slot // per_rank
        # one row per (destination, token), sorted by destination then token
        keys, row_of_pair = torch.unique(dest * t + tokens, return_inverse=True)
        row_counts = torch.bincount(keys // max(t, 1), minlength=world)
        pair_counts = torch.bincount(dest, minlength=world)
        local_row = row_of_pair - (row_counts.cumsum(0) - row_counts)[dest]
        recv = exchange_counts(torch.stack((row_counts, pair_counts), 1), self.group)
        send_rows, send_pairs = row_counts.tolist(), pair_counts.tolist()
        recv_rows, recv_pairs = [r for r, _ in recv], [p for _, p in recv]
        send_order = dest.argsort(stable=True)  # pairs grouped by destination rank
        meta = torch.stack((weights.flatten()[order], (slot % per_rank).float(), local_row.float()), -1)
        rows = start_exchange(x.index_select(0, keys % max(t, 1)), send_rows, recv_rows, self.group)
        pending_meta = start_exchange(meta[send_order], send_pairs, recv_pairs, self.group)
        me, row = self.rank, x.shape[1] * x.element_size()
        self.comm.bytes_sent += ((sum(send_rows) - send_rows[me]) * row
                                 + (sum(send_pairs) - send_pairs[me]) * meta.shape[1] * meta.element_size())
        self.comm.tokens += t
        return _Dispatch(tokens, send_order, send_pairs, recv_rows, recv_pairs, x.shape, rows, pending_meta)

    def _combine(self, d: _Dispatch, layer: MoEWeights) -> torch.Tensor:
        """Compute the received pairs on the local experts, send the outputs back, and add them into
        float32 token sums [T, H] in the accumulation order."""
        rows, meta = d.rows.wait(), d.meta.wait()
        self.received.append(meta.shape[0])
        # one expert pass per source rank: its pairs form the same expert groups as in a single
        # process, so results do not depend on what other ranks send in the same step
        y = torch.cat([
            routed_experts(rows_s.index_select(0, meta_s[:, 2].long()), meta_s[:, :1], meta_s[:, 1:2].long(),
                           layer.experts, layer.swiglu_limit)
            for rows_s, meta_s in zip(rows.split(d.recv_rows), meta.split(d.recv_pairs))
        ])
        back = exchange_rows(y, d.recv_pairs, d.send_pairs, self.group)
        self.comm.bytes_sent += (sum(d.recv_pairs) - d.recv_pairs[self.rank]) * d.shape[1] * y.element_size()
        pairs = torch.empty_like(back)
        pairs[d.send_order] = back  # back in the accumulation order
        out = torch.zeros(d.shape, dtype=torch.float32, device=back.device)
        return out.index_add_(0, d.tokens, pairs.float())

    def _slots(self, logical: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Physical slot of each pair (pairs sorted by logical expert): an expert's pairs go round-robin
        over its replicas."""
        table, n_rep = (t.to(logical.device) for t in self._replicas)
        start = counts.cumsum(0) - counts
        j = torch.arange(logical.numel(), device=logical.device) - start[logical]
        return table[logical, j % n_rep[logical]]
