"""Sparse sink attention (64 heads x 512, one shared K=V head, bf16) against the reference op.

Decode, the kernel's default tiles ("default": chosen by row count and cache format) and each decode
tile variant (`DECODE_VARIANTS`, forced for every case) on the same inputs, at 8k and 64k context,
B = 1, 8, 64, 128, both cache precisions:
* bf16 (sparse_attention_sink over a gathered buffer): B sequences, each with its own compressed
  stream of ctx/2 entries (ratio 2) and a 128-key window; every query row attends to its 128 window
  keys plus 512 distinct random entries (K = 640);
* release (sparse_attention_paged): per row its FP8 + UE8M0/32 window ring (127 cached keys + its own
  new key) and 512 NVFP4 + E4M3/16 entries of its ctx/2 compressed entries through its block table;
  the op's time includes encoding the step's key and storing it in the ring.
Bandwidth counts the bytes the op must touch: every selected key row once in its cache format (scales
included), q, the output (and the new key's ring row); not the index arrays, not the split partials.
Each variant's output is checked against the reference (relative L2 error).
Prefill: one 2048-token prompt (1024 compressed entries, causal window and visibility).
--sweep: a sweep of the kernel's tiles at ctx 64k (decode) and on the prefill instead.

    python benchmarks/kernels/attention.py [--out table.md] [--decode] [--quick] [--default-only] [--sweep]
(--decode: no prefill; --quick: decode at B = 1, 64, 128 only; --default-only: no forced variants)
Environment: ATTN_VARIANTS=default,v1s3a1,sh32x4 times only these variants (pdl, pdlx, pdl1: sh32x4 with
programmatic dependent launch, see attention.DECODE_VARIANTS); ATTN_CACHES=bf16 (or release)
only that cache precision; ATTN_BATCHES=64,128 only these batch sizes.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os

import torch
from common import backends, copy_bandwidth_gbs, eager_ms, emit, graph_ms, input_sets, parse_args

import deepinfer_kernels_cuda.attention as kernel
from deepinfer.cache.codecs import Codec

HEADS, DIM, WINDOW, TOPK = 64, 512, 128, 512
SWEEP = [kernel.Tiles(False, n, 8, stages, per_sm)
         for n, stages, per_sm in ((32, 2, 2.0), (32, 2, 1.0), (32, 2, 0.5), (64, 1, 0.5), (32, 3, 0.5),
                                   (32, 4, 0.5))]


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


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def decode_case(make, nbytes: int, op, ref_op, copy: float, variants: tuple[str, ...]) -> list[list[object]]:
    """[variant, graph µs, GB/s, % of copy, reference eager µs, rel err] of each decode variant."""
    sets = input_sets(make, nbytes)
    r_ms = eager_ms(lambda: ref_op(*sets[0]))
    want = ref_op(*sets[0])
    rows = []
    for variant in variants:
        use_variant(variant)
        try:
            err = rel_err(op(*sets[0]), want)
            g_ms = graph_ms(op, sets)
        except Exception as e:  # a variant that does not build (shared memory, registers) is reported
            rows.append([variant, f"failed: {type(e).__name__}", "", "", r_ms * 1e3, ""])
            continue
        gbs = nbytes / g_ms / 1e6
        rows.append([variant, g_ms * 1e3, gbs, f"{100 * gbs / copy:.0f}%", r_ms * 1e3, f"{err:.1e}"])
    return rows


DECODE_CHOICES = ("DECODE_TILES", "STAGED_DECODE_TILES", "FEW_ROWS_DECODE_TILES")  # picked by rows and cache
DEFAULT_TILES = {name: getattr(kernel, name) for name in DECODE_CHOICES}


def use_variant(variant: str) -> None:
    """"default": the kernel's choice by row count and cache format; else one `DECODE_VARIANTS` entry for
    every case."""
    for name in DECODE_CHOICES:
        tiles = DEFAULT_TILES[name] if variant == "default" else kernel.DECODE_VARIANTS[variant]
        setattr(kernel, name, tiles)


def _build(variant: str, paged: bool) -> None:
    """Runs one variant's kernels for one op once, so that the Triton cache holds them when the timing
    process asks."""
    cuda, _ = backends()
    use_variant(variant)
    try:
        for batch in (1, 64, 128):  # few rows, split grids and one program per row
            if paged:
                *args, kwargs = paged_inputs(batch, 8192, cuda)
                cuda.sparse_attention_paged(*args, **kwargs)
            else:
                cuda.sparse_attention_sink(*decode_inputs(batch, 8192))
        torch.cuda.synchronize()
    except Exception as e:  # the timing process reports the variant as failed
        print(f"building {variant} (paged {paged}) failed: {e!r}", flush=True)


def chosen_variants(default_only: bool) -> tuple[str, ...]:
    """The variants to time: ATTN_VARIANTS if set, else the default and every DECODE_VARIANTS entry."""
    if os.environ.get("ATTN_VARIANTS"):
        return tuple(os.environ["ATTN_VARIANTS"].split(","))
    return ("default",) if default_only else ("default", *kernel.DECODE_VARIANTS)


def chosen_caches() -> tuple[bool, ...]:
    """Paged (release) or not (bf16) per ATTN_CACHES: "bf16", "release" or both when unset."""
    caches = os.environ.get("ATTN_CACHES", "bf16,release").split(",")
    return tuple(paged for paged, name in ((False, "bf16"), (True, "release")) if name in caches)


def build_in_parallel(variants: tuple[str, ...]) -> None:
    """Compiles every decode variant's kernels in parallel processes (each compile takes seconds)."""
    jobs = list(itertools.product(variants, chosen_caches()))
    with multiprocessing.get_context("spawn").Pool(len(jobs)) as pool:
        pool.starmap(_build, jobs)


def decode_rows(cuda, ref, copy: float, quick: bool, variants: tuple[str, ...]) -> list[list[object]]:
    """One row per (precision, ctx, batch, variant), printed as measured (a cut-off run keeps them)."""
    precisions = {
        "bf16": (decode_inputs, touched_bytes, cuda.sparse_attention_sink, ref.sparse_attention_sink),
        "FP8 ring + NVFP4 pool": (lambda b, c: paged_inputs(b, c, cuda), paged_bytes,
                                  lambda *a: cuda.sparse_attention_paged(*a[:-1], **a[-1]),
                                  lambda *a: ref.sparse_attention_paged(*a[:-1], **a[-1])),
    }
    batches = (1, 64, 128) if quick else (1, 8, 64, 128)
    if os.environ.get("ATTN_BATCHES"):
        batches = tuple(int(b) for b in os.environ["ATTN_BATCHES"].split(","))
    names = [name for name, paged in (("bf16", False), ("FP8 ring + NVFP4 pool", True))
             if paged in chosen_caches()]
    precisions = {name: precisions[name] for name in names}
    rows = []
    for ctx, (name, (make, nbytes, op, ref_op)), batch in itertools.product(
            (65536, 8192), precisions.items(), batches):
        case = decode_case(lambda m=make, b=batch, c=ctx: m(b, c), nbytes(batch), op, ref_op, copy, variants)
        for row in case:
            rows.append([name, f"{ctx // 1024}k", batch, *row])
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    torch.manual_seed(0)
    args = parse_args(__doc__, "--decode", "--quick", "--default-only", "--sweep")
    cuda, ref = backends()
    copy = copy_bandwidth_gbs()
    if args.sweep:
        sweep(cuda, ref, copy, prefill_inputs(2048), args.out)
        return
    variants = chosen_variants(args.default_only)
    build_in_parallel(variants)
    rows = decode_rows(cuda, ref, copy, args.quick, variants)
    use_variant("default")
    emit(f"sparse attention decode, {HEADS} heads x {DIM}, K = {WINDOW}+{TOPK}, bf16 queries, CUDA graph "
         f"(copy {copy:.0f} GB/s)", ["cache", "ctx", "B", "variant", "cuda graph µs", "GB/s", "% of copy",
                                      "reference eager µs", "rel err"], rows, args.out)
    if args.decode:
        return
    prefill = prefill_inputs(2048)
    k_ms = eager_ms(lambda: cuda.sparse_attention_sink(*prefill))
    r_ms = eager_ms(lambda: ref.sparse_attention_sink(*prefill))
    tflops = 4 * HEADS * DIM * int((prefill[2] >= 0).sum()) / k_ms / 1e9
    emit("sparse_attention_sink prefill, 2048 rows", ["cuda eager µs", "reference eager µs", "speedup",
         "TFLOP/s"], [[k_ms * 1e3, r_ms * 1e3, r_ms / k_ms, tflops]], args.out)


def sweep(cuda, ref, copy: float, prefill: tuple, out) -> None:
    decode = {b: input_sets(lambda b=b: decode_inputs(b, 65536), touched_bytes(b)) for b in (1, 64, 128)}
    want = {batch: ref.sparse_attention_sink(*sets[0]).float() for batch, sets in decode.items()}
    want[2048] = ref.sparse_attention_sink(*prefill).float()
    prefill_default = kernel.PREFILL_TILES
    rows = []
    for tiles in SWEEP:
        for name in (*DECODE_CHOICES, "PREFILL_TILES"):
            setattr(kernel, name, tiles)
        row = [tiles.halves, tiles.block_n, tiles.num_warps, tiles.num_stages, tiles.programs_per_sm]
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
    use_variant("default")
    kernel.PREFILL_TILES = prefill_default
    emit("tile sweep (decode ctx 64k: graph µs, % of copy at B 1, 64, 128; prefill 2048: eager µs, TFLOP/s)",
         ["halves", "BLOCK_N", "warps", "stages", "programs/SM", "B1 µs", "B1 %", "B64 µs", "B64 %",
          "B128 µs", "B128 %", "prefill µs", "prefill TFLOP/s", "max rel err"], rows, out)


if __name__ == "__main__":
    main()
