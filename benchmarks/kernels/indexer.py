"""Lightning-indexer scores at Flash width (32 heads x 128, bf16) against the reference op.

N = compressed entries scored per query row: 4096 (8k context at ratio 2) and 32768 (64k context).
Then indexer_topk (paged MXFP4 keys, scores + top-512 per row) at 64k context (capacity 32768), each
row of a decode batch in its own sequence, and its top-k select alone: the path the op takes for that
row count (several programs per row below ~264 rows) against one program per row.
    python benchmarks/kernels/indexer.py [--out table.md] [--select]   (--select: only the select alone)
"""

from __future__ import annotations

import torch
from common import backends, copy_bandwidth_gbs, emit, graph_ms, input_sets, parse_args, times_ms

from deepinfer.cache.codecs import Codec
from deepinfer_kernels_cuda.indexer import select_chunk, topk_select

HEADS, DIM, TOPK, PER_BLOCK = 32, 128, 512, 64


def make(t: int, n: int) -> tuple:
    q = torch.randn(t, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(n, DIM, device="cuda", dtype=torch.bfloat16)
    return q, k, torch.randn(t, HEADS, device="cuda", dtype=torch.bfloat16)


def topk_inputs(t: int, capacity: int) -> tuple:
    """t decode rows, each in its own sequence with `capacity` visible MXFP4 index keys."""
    codec = Codec("mxfp4", DIM, torch.bfloat16)
    table = capacity // PER_BLOCK
    pool = torch.randint(0, 256, (t * table, PER_BLOCK, codec.nbytes), dtype=torch.uint8, device="cuda")
    pool[..., codec.data_bytes :] = torch.randint(120, 130, (), dtype=torch.uint8)  # sane UE8M0 scales
    q = torch.randn(t, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(t, HEADS, device="cuda", dtype=torch.bfloat16)
    tables = torch.randperm(t * table, device="cuda").view(t, table)
    visible = torch.full((t,), capacity, device="cuda")
    return q, w, pool, codec, tables, torch.arange(t, device="cuda"), visible, capacity, TOPK


def main() -> None:
    args = parse_args(__doc__, "--select")
    if not args.select:
        scores_and_topk(args.out)
    select_alone(args.out)


def scores_and_topk(out) -> None:
    cuda, ref = backends()
    copy = copy_bandwidth_gbs()
    rows = []
    for n in (4096, 32768):
        for t in (1, 64, 2048):
            nbytes = t * HEADS * DIM * 2 + n * DIM * 2 + t * HEADS * 2 + t * n * 4
            sets = input_sets(lambda t=t, n=n: make(t, n), nbytes)
            g_ms, e_ms, r_ms = times_ms(cuda.indexer_logits, ref.indexer_logits, sets)
            gbs, tflops = nbytes / g_ms / 1e6, 2 * t * HEADS * n * DIM / g_ms / 1e9
            pct = f"{100 * gbs / copy:.0f}%"
            rows.append([n, t, g_ms * 1e3, e_ms * 1e3, r_ms * 1e3, r_ms / e_ms, gbs, pct, tflops])
            del sets
    emit(f"indexer_logits, {HEADS} heads x {DIM}, bf16 (copy bandwidth {copy:.0f} GB/s)",
         ["N", "T", "cuda graph µs", "cuda eager µs", "reference eager µs", "eager speedup", "GB/s (graph)",
          "% of copy", "TFLOP/s (graph)"], rows, out)
    rows = []
    capacity = 32768
    for t in (1, 8, 64):
        nbytes = t * capacity * (DIM // 2 + DIM // 32)  # the keys read; scores stay in L2-sized buffers
        sets = input_sets(lambda t=t: topk_inputs(t, capacity), nbytes)
        g_ms, e_ms, r_ms = times_ms(cuda.indexer_topk, ref.indexer_topk, sets)
        gbs = nbytes / g_ms / 1e6
        rows.append([t, g_ms * 1e3, e_ms * 1e3, r_ms * 1e3, r_ms / e_ms, gbs, f"{100 * gbs / copy:.0f}%"])
        del sets
    emit(f"indexer_topk, 64k context (capacity {capacity}, MXFP4 keys), top-{TOPK}, one sequence per row",
         ["T", "cuda graph µs", "cuda eager µs", "reference eager µs", "eager speedup", "key GB/s (graph)",
          "% of copy"], rows, out)


def select_alone(out) -> None:
    capacity = 32768
    rows = []
    for t in (1, 8, 64):
        sets = input_sets(lambda t=t: (torch.randn(t, capacity, device="cuda"),), t * capacity * 4)
        chosen = graph_ms(lambda s: topk_select(s, TOPK), sets)
        one = graph_ms(lambda s: topk_select(s, TOPK, chunk=capacity), sets)
        rows.append([t, select_chunk(t, capacity), chosen * 1e3, one * 1e3, one / chosen])
        print(rows[-1], flush=True)  # a cut-off run keeps the rows measured
        del sets
    emit(f"top-{TOPK} select alone, capacity {capacity} (random float32 scores)",
         ["T", "entries per program", "chosen path graph µs", "one program per row graph µs", "speedup"],
         rows, out)


if __name__ == "__main__":
    main()
