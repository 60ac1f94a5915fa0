"""Variable-size row exchange over the group: counts first, then payload rows (all_to_all_single).

Payloads travel as raw bytes (one uint8 row per tensor row), so every dtype works on every backend
(gloo has no FP8 or E8M0) and values arrive bit for bit. Split sizes are host ints: the counts are
read on the host once per exchange.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist


def exchange_counts(send: torch.Tensor, group: dist.ProcessGroup | None) -> list:
    """send [n] (or [n, c]) int64 counts for each rank -> what each rank sent to this one (host ints,
    [n] or [n][c])."""
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send.contiguous(), group=group)
    return recv.tolist()


@dataclass
class PendingRows:
    """An exchange in flight: `wait()` -> the rows received."""

    work: dist.Work | None
    out: torch.Tensor  # uint8 [rows, row_bytes]
    dtype: torch.dtype
    shape: tuple[int, ...]  # row shape

    def wait(self) -> torch.Tensor:
        if self.work is not None:
            self.work.wait()
        return self.out.view(self.dtype).reshape(self.out.shape[0], *self.shape)


def start_exchange(t: torch.Tensor, send: list[int], recv: list[int], group: dist.ProcessGroup | None
                   ) -> PendingRows:
    """Start sending rows of `t` [sum(send), ...], grouped by destination rank; the rows sent here
    [sum(recv), ...] come from `wait()` (work placed between the two overlaps the transfer)."""
    row_bytes = math.prod(t.shape[1:]) * t.element_size()
    wire = t.contiguous().view(torch.uint8).reshape(t.shape[0], row_bytes)
    out = torch.empty(sum(recv), row_bytes, dtype=torch.uint8, device=t.device)
    work = dist.all_to_all_single(out, wire, output_split_sizes=recv, input_split_sizes=send, group=group,
                                  async_op=True)
    return PendingRows(work, out, t.dtype, tuple(t.shape[1:]))


def exchange_rows(t: torch.Tensor, send: list[int], recv: list[int], group: dist.ProcessGroup | None
                  ) -> torch.Tensor:
    """Rows of `t` [sum(send), ...], grouped by destination rank -> the rows sent here [sum(recv), ...]."""
    return start_exchange(t, send, recv, group).wait()
