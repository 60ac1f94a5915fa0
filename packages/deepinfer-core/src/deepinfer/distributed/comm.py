"""Variable-size row exchange over the group: counts first, then payload rows (all_to_all_single).

Payloads travel as raw bytes (one uint8 row per tensor row), so every dtype works on every backend
(gloo has no FP8 or E8M0) and values arrive bit for bit. Split sizes are host ints: the counts are
read on the host once per exchange.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


def exchange_counts(send: torch.Tensor, group: dist.ProcessGroup | None) -> list[int]:
    """send [n] int64 rows for each rank -> rows each rank sends to this one (host ints)."""
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send.contiguous(), group=group)
    return recv.tolist()


def exchange_rows(t: torch.Tensor, send: list[int], recv: list[int], group: dist.ProcessGroup | None
                  ) -> torch.Tensor:
    """Rows of `t` [sum(send), ...], grouped by destination rank -> the rows sent here [sum(recv), ...]."""
    row_bytes = math.prod(t.shape[1:]) * t.element_size()
    wire = t.contiguous().view(torch.uint8).reshape(t.shape[0], row_bytes)
    out = torch.empty(sum(recv), row_bytes, dtype=torch.uint8, device=t.device)
    dist.all_to_all_single(out, wire, output_split_sizes=recv, input_split_sizes=send, group=group)
    return out.view(t.dtype).reshape(sum(recv), *t.shape[1:])
