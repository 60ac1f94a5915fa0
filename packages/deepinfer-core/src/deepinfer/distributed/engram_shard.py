"""Row-sharded Engram tables: each rank holds one contiguous block of rows and, per step, fetches the
rows its tokens hash to from their owners (model spec §9.5).

Rows travel in storage form (FP8 bytes and UE8M0 scales), so the lookup op dequantises exactly what a
single process would read. Each distinct row is fetched once per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from deepinfer.distributed.comm import exchange_counts, exchange_rows


@dataclass(frozen=True)
class EngramShard:
    begin: int  # first table row held here
    per_rank: int  # rows per rank (the last rank may hold fewer)
    world_size: int
    group: dist.ProcessGroup | None

    def gather(self, table: torch.Tensor, scale: torch.Tensor, rows: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(rows' table data, their scales, `rows` re-indexed into those) for a lookup of global `rows`."""
        unique, inverse = torch.unique(rows.reshape(-1), return_inverse=True)
        send_t = torch.bincount(unique // self.per_rank, minlength=self.world_size)
        send = send_t.tolist()
        recv = exchange_counts(send_t, self.group)
        asked = exchange_rows(unique, send, recv, self.group) - self.begin
        data = exchange_rows(table.index_select(0, asked), recv, send, self.group)
        scales = exchange_rows(scale.index_select(0, asked), recv, send, self.group)
        return data, scales, inverse.view(rows.shape)
