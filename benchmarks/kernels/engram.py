"""Engram ops of one Engram layer at Flash-like widths (hidden 4096, 4 streams, 3-grams x 8 heads = 16 table
heads of 128 FP8 values, bf16 model) against the reference ops, for 1, 64 and 2048 rows. Bandwidth counts
the bytes an op must touch (gathered table rows and scales, inputs read once, outputs written once) as a
share of the device-to-device copy bandwidth.

    python benchmarks/kernels/engram.py [--out table.md]
"""

from __future__ import annotations

from functools import partial

import torch
from common import OP_COLUMNS, Case, copy_bandwidth_gbs, emit, op_rows, parse_args

from deepinfer.checkpoint.formats import quantize_fp8_rows
from deepinfer.config import engram_multipliers, engram_primes

N, HEADS, VOCAB, D, M, H, TABLE_VOCAB = 3, 8, 129280, 128, 4, 4096, 100_000
PRIMES = torch.tensor(engram_primes([2], N, HEADS, TABLE_VOCAB)[0])
TABLE_HEADS = (N - 1) * HEADS


def hash_args(t: int) -> tuple:
    offsets = (PRIMES.flatten().cumsum(0) - PRIMES.flatten()).view_as(PRIMES)
    ngrams = torch.randint(0, VOCAB, (t, N), device="cuda")
    return ngrams, torch.tensor(engram_multipliers(2, N, VOCAB), device="cuda"), PRIMES.cuda(), offsets.cuda()


_TABLE: list[torch.Tensor] = []


def lookup_args(t: int) -> tuple:
    if not _TABLE:  # one table (~400 MB) shared by every input set, as the layer's is
        _TABLE.extend(quantize_fp8_rows(torch.randn(int(PRIMES.sum()), D, device="cuda")))
    rows = torch.randint(0, int(PRIMES.sum()), (t, TABLE_HEADS), device="cuda")
    return _TABLE[0], _TABLE[1], rows, torch.bfloat16


def gate_args(t: int) -> tuple:
    proj = torch.randn(t, (M + 1) * H, device="cuda", dtype=torch.bfloat16)
    keys, value = proj.split((M * H, H), dim=-1)  # column slices of the wkv output, as in the model
    return (torch.randn(t, M, H, device="cuda", dtype=torch.bfloat16), keys.unflatten(-1, (M, H)), value,
            torch.randn(M, H, device="cuda"), torch.rand(t, device="cuda") > 0.1, 1e-6)


def cases(t: int) -> dict[str, Case]:
    return {
        "engram_hash": (lambda o: o.engram_hash, partial(hash_args, t), t * (N + TABLE_HEADS) * 8),
        "engram_lookup": (lambda o: o.engram_lookup, partial(lookup_args, t),
                          t * TABLE_HEADS * (8 + D + D // 32 + D * 2)),
        "engram_gate": (lambda o: o.engram_gate, partial(gate_args, t),
                        t * (3 * M * H + H) * 2 + M * H * 4 + t),
    }


def main() -> None:
    out = parse_args(__doc__).out
    copy = copy_bandwidth_gbs()
    rows = op_rows(cases, (1, 64, 2048), copy)
    emit(f"Engram ops, one layer (copy bandwidth {copy:.0f} GB/s)", ["op", "rows", *OP_COLUMNS], rows, out)


if __name__ == "__main__":
    main()
