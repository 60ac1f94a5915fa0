"""Sparse sink attention (64 heads x 512, one shared K=V head, bf16) against the reference op.

Decode: B sequences, each with its own compressed stream of ctx/2 entries (ratio 2) and a 128-key
window; every query row attends to its 128 window keys plus 512 distinct random entries (K = 640).
Bandwidth counts the bytes the kernel must touch: the 640 gathered KV rows, q and the output.
Prefill: one 2048-token prompt (1024 compressed entries, causal window and visibility).
A small sweep of the kernel's tile constants runs at the decode shapes.

    python benchmarks/kernels/attention.py [--out table.md]
"""

from __future__ import annotations

import itertools

import torch
from common import backends, bench_ms, copy_bandwidth_gbs, emit, parse_out

import deepinfer_kernels_cuda.attention as kernel

HEADS, DIM, WINDOW, TOPK = 64, 512, 128, 512


def decode_inputs(batch: int, ctx: int, g: torch.Generator):
    entries = ctx // 2
    region = entries + WINDOW
    kv = torch.randn(batch * region, DIM, device="cuda", dtype=torch.bfloat16)
    base = torch.arange(batch).unsqueeze(1) * region
    window = base + entries + torch.arange(WINDOW)
    chosen = torch.stack([torch.randperm(entries, generator=g)[:TOPK] for _ in range(batch)]) + base
    idx = torch.cat((window, chosen.sort(dim=1).values), dim=1).cuda()
    q = torch.randn(batch, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    return q, kv, idx, torch.randn(HEADS, device="cuda"), DIM**-0.5


def prefill_inputs(t: int, g: torch.Generator):
    entries = t // 2
    kv = torch.randn(entries + t, DIM, device="cuda", dtype=torch.bfloat16)
    rows = torch.arange(t).unsqueeze(1)
    window = rows - WINDOW + 1 + torch.arange(WINDOW)
    window = torch.where(window >= 0, window + entries, -1)
    chosen = torch.stack([torch.randperm(entries, generator=g)[:TOPK] for _ in range(t)]).sort(dim=1).values
    chosen = torch.where(chosen < (rows + 1) // 2, chosen, -1)
    idx = torch.cat((window, chosen), dim=1).cuda()
    q = torch.randn(t, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    return q, kv, idx, torch.randn(HEADS, device="cuda"), DIM**-0.5


def touched_bytes(q: torch.Tensor, idx: torch.Tensor) -> int:
    return int((idx >= 0).sum()) * DIM * 2 + 2 * q.nbytes


def main() -> None:
    out = parse_out(__doc__)
    cuda, ref = backends()
    copy = copy_bandwidth_gbs()
    g = torch.Generator().manual_seed(0)
    rows = []
    for ctx, batch in itertools.product((8192, 65536), (1, 8, 64, 128)):
        args = decode_inputs(batch, ctx, g)
        k_ms = bench_ms(lambda a=args: cuda.sparse_attention_sink(*a))
        r_ms = bench_ms(lambda a=args: ref.sparse_attention_sink(*a))
        gbs = touched_bytes(args[0], args[2]) / k_ms / 1e6
        rows.append([f"decode ctx {ctx // 1024}k", batch, k_ms * 1e3, r_ms * 1e3, r_ms / k_ms, gbs,
                     f"{100 * gbs / copy:.0f}%"])
    args = prefill_inputs(2048, g)
    k_ms = bench_ms(lambda: cuda.sparse_attention_sink(*args))
    r_ms = bench_ms(lambda: ref.sparse_attention_sink(*args))
    tflops = 4 * HEADS * DIM * int((args[2] >= 0).sum()) / k_ms / 1e9
    rows.append(["prefill (GB/s column: TFLOP/s)", 2048, k_ms * 1e3, r_ms * 1e3, r_ms / k_ms, tflops, ""])
    emit(f"sparse_attention_sink, {HEADS} heads x {DIM}, K = {WINDOW}+{TOPK}, bf16 (copy {copy:.0f} GB/s)",
         ["case", "rows", "cuda µs", "reference µs", "speedup", "GB/s", "% of copy"], rows, out)

    sweep = []
    defaults = (kernel._DV_BLOCK, kernel._BLOCK_N, kernel._NUM_WARPS)
    cases = {batch: decode_inputs(batch, 65536, g) for batch in (1, 64)}
    for dv, bn, warps in [(256, 32, 4), (512, 32, 4), (256, 64, 4), (512, 64, 8), (256, 32, 8), (128, 32, 4)]:
        kernel._DV_BLOCK, kernel._BLOCK_N, kernel._NUM_WARPS = dv, bn, warps
        for batch, args in cases.items():
            k_ms = bench_ms(lambda a=args: cuda.sparse_attention_sink(*a))
            gbs = touched_bytes(args[0], args[2]) / k_ms / 1e6
            sweep.append([dv, bn, warps, batch, k_ms * 1e3, gbs, f"{100 * gbs / copy:.0f}%"])
    kernel._DV_BLOCK, kernel._BLOCK_N, kernel._NUM_WARPS = defaults
    emit("decode tile sweep, ctx 64k", ["DV block", "BLOCK_N", "warps", "rows", "µs", "GB/s", "% of copy"],
         sweep, out)


if __name__ == "__main__":
    main()
