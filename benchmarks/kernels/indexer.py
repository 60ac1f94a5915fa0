"""Lightning-indexer scores at Flash width (32 heads x 128, bf16) against the reference op.

N = compressed entries scored per query row: 4096 (8k context at ratio 2) and 32768 (64k context).
Then indexer_topk (paged MXFP4 keys, scores + top-512 per row) at 64k context (capacity 32768), each
row of a decode batch in its own sequence, and its top-k select alone: the path the op takes for that
row count (several programs per row below ~264 rows) against one program per row.
    python benchmarks/kernels/indexer.py [--out table.md] [--select]   (--select: only the select alone)
--prefill [--baseline FILE] [--ratios 2 1]: only a 2048-token causal prefill's op (one sequence, MXFP4 keys;
capacity 1024 at ratio 2, 2048 at ratio 1: the Flash slice's index layers 1 and 2-3): the scores kernel's
row-tile configs, the select's warps and the whole op, graph-timed, against a baseline module's (an earlier
indexer.py), with the largest difference from it.
"""

from __future__ import annotations

import argparse
import runpy
from pathlib import Path

import torch
from common import backends, copy_bandwidth_gbs, emit, graph_ms, input_sets, times_ms

from deepinfer.cache.codecs import Codec
from deepinfer_kernels_cuda import indexer
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


def prefill_inputs(t: int, ratio: int = 2) -> tuple:
    """One sequence's causal prefill of t rows: row r sees (r + 1) // ratio MXFP4 index keys."""
    capacity = t // ratio
    q, w, pool, codec, tables, _, _, _, _ = topk_inputs(1, capacity)
    q = torch.randn(t, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(t, HEADS, device="cuda", dtype=torch.bfloat16)
    visible = (torch.arange(t, device="cuda") + 1) // ratio
    return q, w, pool, codec, tables, torch.zeros(t, dtype=torch.long, device="cuda"), visible, capacity


PREFILL_CONFIGS = ((4, 8, 128, 128), (4, 8, 128, 0), (1, 8, 128, 128), (2, 8, 128, 128), (16, 8, 128, 128),
                   (4, 4, 128, 0), (1, 8, 256, 128), (2, 8, 256, 128), (4, 8, 256, 128), (16, 8, 256, 0))


def prefill(out, baseline: dict | None, t: int = 2048, ratio: int = 2,
            configs_new: tuple = PREFILL_CONFIGS) -> None:
    """The prefill's scores (row tiles), select and whole op: configs and the baseline, graph µs."""
    sets = input_sets(lambda: prefill_inputs(t, ratio), t * HEADS * DIM * 2 + t * t * 2)
    visible, capacity = sets[0][-2:]
    pairs = int(visible.sum())
    mods = {"new": vars(indexer)} | ({"baseline": baseline} if baseline else {})

    def scores_of(mod: dict):
        def run(q, w, pool, codec, tables, row_seg, visible, capacity):
            scores = torch.empty(t, capacity, device="cuda")
            block_t = mod["tile_rows"](t, 1, HEADS, False)
            mod["paged_scores"](q, w, pool, codec, tables, row_seg, visible, scores, block_t=block_t)
            return scores
        return run

    rows: list[list[object]] = []
    want = scores_of(mods.get("baseline", mods["new"]))(*sets[0])
    configs = [("baseline", None)] if baseline else []
    configs += [("new", c) for c in configs_new]
    default = indexer._TILE_BLOCKS, indexer._TILE_WARPS, indexer._TILE_MMA_ROWS, indexer._TILE_MAXNREG
    for name, config in configs:
        if config:
            indexer._TILE_BLOCKS, indexer._TILE_WARPS, indexer._TILE_MMA_ROWS, indexer._TILE_MAXNREG = config
        try:
            fn = scores_of(mods[name])
            got = fn(*sets[0])
            same = torch.equal(got, want)
            diff = float((got - want).nan_to_num(posinf=0.0, neginf=0.0).abs().max())
            ms = graph_ms(fn, sets)
        finally:
            indexer._TILE_BLOCKS, indexer._TILE_WARPS, indexer._TILE_MMA_ROWS, indexer._TILE_MAXNREG = default
        tflops = 2 * pairs * HEADS * DIM / ms / 1e9
        rows.append([f"scores {name} {config or ''}", ms * 1e3, tflops, same, diff])
        print(rows[-1], flush=True)
    scores = want
    top_want = topk_select(scores, TOPK, chunk=capacity)
    select_default = indexer._SELECT_WARPS, indexer._SELECT_SHORT_WARPS
    for name, warps in ([("baseline", None)] if baseline else []) + [("new", 8), ("new", 4), ("new", 2)]:
        if warps:
            indexer._SELECT_WARPS = indexer._SELECT_SHORT_WARPS = warps
        try:
            fn = mods[name]["topk_select"]
            same = torch.equal(fn(scores, TOPK, chunk=capacity), top_want)
            ms = graph_ms(lambda s, fn=fn: fn(s, TOPK, chunk=capacity), [(scores,)])
        finally:
            indexer._SELECT_WARPS, indexer._SELECT_SHORT_WARPS = select_default
        rows.append([f"select {name} {warps or ''} warps", ms * 1e3, "", same, ""])
        print(rows[-1], flush=True)
    for name, mod in mods.items():
        ms = graph_ms(lambda *a, mod=mod: mod["indexer_topk"](*a, TOPK), sets)
        rows.append([f"indexer_topk {name}", ms * 1e3, "", "", ""])
        print(rows[-1], flush=True)
    emit(f"prefill of {t} rows, ratio {ratio}, capacity {capacity} (causal, one sequence), {HEADS} heads x "
         f"{DIM}, MXFP4 keys; scores configs (key tiles per program, warps, product rows, register cap), "
         "select warps",
         ["case", "graph µs", "TFLOP/s (causal pairs)", "equal to the baseline", "max |difference|"], rows,
         out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="also write the tables (markdown) here")
    ap.add_argument("--select", action="store_true")
    ap.add_argument("--prefill", action="store_true")
    ap.add_argument("--baseline", type=Path, help="with --prefill: a module file (an earlier indexer.py)")
    ap.add_argument("--ratios", type=int, nargs="+", default=[2, 1], help="with --prefill: compress ratios")
    ap.add_argument("--configs", default=None,
                    help="with --prefill: scores configs 'tiles,warps,rows,cap;...' (PREFILL_CONFIGS)")
    args = ap.parse_args()
    if args.prefill:
        configs = PREFILL_CONFIGS if args.configs is None else tuple(
            tuple(int(v) for v in c.split(",")) for c in args.configs.split(";"))
        for ratio in args.ratios:
            prefill(args.out, runpy.run_path(str(args.baseline)) if args.baseline else None, ratio=ratio,
                    configs_new=configs)
        return
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
