"""Sparse sink attention (64 heads x 512, one shared K=V head, bf16) against the reference op.

Decode: B sequences, each with its own compressed stream of ctx/2 entries (ratio 2) and a 128-key
window; every query row attends to its 128 window keys plus 512 distinct random entries (K = 640).
Bandwidth counts the bytes the kernel must touch: the gathered KV rows, q and the output.
Prefill: one 2048-token prompt (1024 compressed entries, causal window and visibility).
Paged decode (sparse_attention_paged, release precision): per row its FP8 window ring (127 cached
keys + its own new key) and 512 NVFP4 entries of a 64k context through its block table.
Then a sweep of the kernel's tiles at ctx 64k (decode) and on the prefill, each checked against the
reference (relative L2 error of the output).

    python benchmarks/kernels/attention.py [--out table.md] [--sweep]   (--sweep: only the tile sweep)
"""

from __future__ import annotations

import itertools

import torch
from common import backends, copy_bandwidth_gbs, eager_ms, emit, graph_ms, input_sets, parse_args, times_ms

import deepinfer_kernels_cuda.attention as kernel
from deepinfer.cache.codecs import Codec

HEADS, DIM, WINDOW, TOPK = 64, 512, 128, 512
SWEEP = [kernel.Tiles(512, 32, 8, 2, 2.0), kernel.Tiles(512, 32, 8, 2, 1.0), kernel.Tiles(512, 32, 8, 2, 0.5),
         kernel.Tiles(512, 64, 8, 1, 0.5), kernel.Tiles(512, 32, 8, 3, 0.5), kernel.Tiles(512, 32, 8, 4, 0.5)]


def decode_inputs(batch: int, ctx: int) -> tuple:
    entries = ctx // 2
    region = entries + WINDOW
    kv = torch.randn(batch * region, DIM, device="cuda", dtype=torch.bfloat16)
    base = torch.arange(batch).unsqueeze(1) * region
    window = base + entries + torch.arange(WINDOW)
    chosen = torch.stack([torch.randperm(entries)[:TOPK] for _ in range(batch)]) + base
    idx = torch.cat((window, chosen.sort(dim=1).values), dim=1).cuda()
    q = torch.randn(batch, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    return q, kv, idx, torch.randn(HEADS, device="cuda"), DIM**-0.5


def prefill_inputs(t: int) -> tuple:
    entries = t // 2
    kv = torch.randn(entries + t, DIM, device="cuda", dtype=torch.bfloat16)
    rows = torch.arange(t).unsqueeze(1)
    window = rows - WINDOW + 1 + torch.arange(WINDOW)
    window = torch.where(window >= 0, window + entries, -1)
    chosen = torch.stack([torch.randperm(entries)[:TOPK] for _ in range(t)]).sort(dim=1).values
    chosen = torch.where(chosen < (rows + 1) // 2, chosen, -1)
    q = torch.randn(t, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    return q, kv, torch.cat((window, chosen), dim=1).cuda(), torch.randn(HEADS, device="cuda"), DIM**-0.5


def paged_inputs(batch: int, ctx: int, ops) -> tuple:
    """Release-precision caches: FP8 ring of 128 per row, NVFP4 pool of ctx/2 entries per row."""
    ring_codec, pool_codec = Codec("fp8", DIM, torch.bfloat16), Codec("nvfp4", DIM, torch.bfloat16)
    per_block, entries = 64, ctx // 2
    table = entries // per_block
    ring = ring_codec.encode(torch.randn(batch * WINDOW, DIM, device="cuda"), ops).view(batch, WINDOW, -1)
    distinct = pool_codec.encode(torch.randn(4096, DIM, device="cuda"), ops)
    pool = distinct[torch.randint(0, 4096, (batch * table * per_block,), device="cuda")]
    rows = torch.arange(batch, device="cuda")
    window = torch.cat((rows[:, None] * WINDOW + torch.arange(WINDOW - 1, device="cuda"),
                        batch * WINDOW + rows[:, None]), dim=1)  # 127 cached keys + this step's key
    topk = torch.stack([torch.randperm(entries, device="cuda")[:TOPK].sort().values for _ in range(batch)])
    q = torch.randn(batch, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(batch, DIM, device="cuda", dtype=torch.bfloat16)
    kwargs = dict(pool=pool.view(batch * table, per_block, -1), pool_codec=pool_codec, topk=topk,
                  block_tables=torch.randperm(batch * table, device="cuda").view(batch, table), row_seg=rows)
    sink = torch.randn(HEADS, device="cuda")
    return q, kv, ring, ring_codec, window, rows * WINDOW + WINDOW - 1, rows, sink, DIM**-0.5, kwargs


def paged_bytes(batch: int) -> int:
    return batch * ((WINDOW + 1) * (DIM + DIM // 32) + TOPK * (DIM // 2 + DIM // 16) + 2 * HEADS * DIM * 2)


def touched_bytes(batch: int) -> int:
    return batch * (WINDOW + TOPK) * DIM * 2 + 2 * batch * HEADS * DIM * 2


def main() -> None:
    torch.manual_seed(0)
    args = parse_args(__doc__, "--sweep")
    cuda, ref = backends()
    copy = copy_bandwidth_gbs()
    if args.sweep:
        sweep(cuda, ref, copy, prefill_inputs(2048), args.out)
        return
    out = args.out
    rows = []
    for ctx, batch in itertools.product((8192, 65536), (1, 64, 128)):
        sets = input_sets(lambda b=batch, c=ctx: decode_inputs(b, c), touched_bytes(batch))
        g_ms, e_ms, r_ms = times_ms(cuda.sparse_attention_sink, ref.sparse_attention_sink, sets)
        gbs = touched_bytes(batch) / g_ms / 1e6
        pct = f"{100 * gbs / copy:.0f}%"
        case = f"decode ctx {ctx // 1024}k"
        rows.append([case, batch, g_ms * 1e3, e_ms * 1e3, r_ms * 1e3, r_ms / e_ms, gbs, pct])
        del sets
    for batch in (1, 64, 128):
        sets = input_sets(lambda b=batch: paged_inputs(b, 65536, cuda), paged_bytes(batch))
        g_ms, e_ms, r_ms = times_ms(lambda *a: cuda.sparse_attention_paged(*a[:-1], **a[-1]),
                                    lambda *a: ref.sparse_attention_paged(*a[:-1], **a[-1]), sets)
        gbs = paged_bytes(batch) / g_ms / 1e6
        pct = f"{100 * gbs / copy:.0f}%"
        rows.append(["paged FP8 ring + NVFP4 pool, ctx 64k", batch, g_ms * 1e3, e_ms * 1e3, r_ms * 1e3,
                     r_ms / e_ms, gbs, pct])
        del sets
    prefill = prefill_inputs(2048)
    k_ms = eager_ms(lambda: cuda.sparse_attention_sink(*prefill))
    r_ms = eager_ms(lambda: ref.sparse_attention_sink(*prefill))
    tflops = 4 * HEADS * DIM * int((prefill[2] >= 0).sum()) / k_ms / 1e9
    rows.append(["prefill (GB/s column: TFLOP/s)", 2048, "", k_ms * 1e3, r_ms * 1e3, r_ms / k_ms, tflops, ""])
    emit(f"sparse_attention_sink, {HEADS} heads x {DIM}, K = {WINDOW}+{TOPK}, bf16 (copy {copy:.0f} GB/s)",
         ["case", "rows", "cuda graph µs", "cuda eager µs", "reference eager µs", "eager speedup",
          "GB/s (graph)", "% of copy"], rows, out)


def sweep(cuda, ref, copy: float, prefill: tuple, out) -> None:
    decode = {b: input_sets(lambda b=b: decode_inputs(b, 65536), touched_bytes(b)) for b in (1, 64, 128)}
    want = {batch: ref.sparse_attention_sink(*sets[0]).float() for batch, sets in decode.items()}
    want[2048] = ref.sparse_attention_sink(*prefill).float()
    defaults = (kernel.DECODE_TILES, kernel.PREFILL_TILES)
    rows = []
    for tiles in SWEEP:
        kernel.DECODE_TILES = kernel.PREFILL_TILES = tiles
        row = [tiles.dv_block, tiles.block_n, tiles.num_warps, tiles.num_stages, tiles.programs_per_sm]
        worst = 0.0
        try:
            for batch, sets in decode.items():
                got = cuda.sparse_attention_sink(*sets[0]).float()
                worst = max(worst, float((got - want[batch]).norm() / want[batch].norm()))
                g_ms = graph_ms(cuda.sparse_attention_sink, sets)
                row += [g_ms * 1e3, f"{100 * touched_bytes(batch) / g_ms / 1e6 / copy:.0f}%"]
            got = cuda.sparse_attention_sink(*prefill).float()
            worst = max(worst, float((got - want[2048]).norm() / want[2048].norm()))
            p_ms = eager_ms(lambda: cuda.sparse_attention_sink(*prefill))
            row += [p_ms * 1e3, 4 * HEADS * DIM * int((prefill[2] >= 0).sum()) / p_ms / 1e9, f"{worst:.1e}"]
        except Exception as e:  # a tile that does not fit (shared memory) is reported, not fatal
            row += [f"failed: {type(e).__name__}"]
        rows.append(row)
    kernel.DECODE_TILES, kernel.PREFILL_TILES = defaults
    emit("tile sweep (decode ctx 64k: graph µs, % of copy at B 1, 64, 128; prefill 2048: eager µs, TFLOP/s)",
         ["DV", "BLOCK_N", "warps", "stages", "programs/SM", "B1 µs", "B1 %", "B64 µs", "B64 %", "B128 µs",
          "B128 %", "prefill µs", "prefill TFLOP/s", "max rel err"], rows, out)


if __name__ == "__main__":
    main()
