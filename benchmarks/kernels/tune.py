"""Tile-config sweep for the block-scaled linears and the MoE expert GEMMs at Flash shapes; writes the
per-GPU JSON that deepinfer_kernels_cuda.configs reads (no autotuning at serve time).
Entries not re-tuned keep their values. Usage (GPU):
python3 benchmarks/kernels/tune.py [--out FILE] [--budget-s 150] [--tokens 1,4096] [--no-moe]
    [--shapes q_a+kv,q_b+] [--gemv1]"""

from __future__ import annotations

import argparse
import functools
import math
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import torch
from common import eager_ms
from linear import L2_BYTES, make_weight, rotating_calls
from moe import FLASH, flash_layers
from roofline import FLASH_LINEARS, TOKENS, graph_ms

from deepinfer_kernels_cuda import configs, linear, moe
from deepinfer_kernels_cuda.configs import TileConfig

GEMV_ROWS = (1, 2, 4, 8, 16)  # FP8 GEMV rows per program (dividing 32)
GEMV_LOADS = (4, 8, 16)  # 8-byte weight loads per thread per K step (rows x chunks per thread)
SMALL_M = [  # (block_n, block_k, num_warps, num_stages), split-K swept around the default
    (64, 256, 4, 4), (64, 128, 4, 6), (128, 256, 8, 3), (64, 512, 4, 3),
]
LARGE_M = [  # (block_n, block_m, block_k, num_warps, num_stages)
    (128, 128, 64, 8, 3), (128, 64, 64, 4, 4), (128, 128, 128, 8, 3), (128, 256, 64, 8, 3),
    (256, 128, 64, 8, 3),
]
MOE = [  # grouped gate+up (and down) tiles; split_k 2: a second accumulator; 7th field: maxnreg; 8th: tma
    TileConfig(64, 16, 128, 1, 4, 4), TileConfig(64, 16, 256, 1, 4, 3), TileConfig(128, 16, 128, 1, 8, 3),
    TileConfig(64, 32, 128, 1, 4, 4), TileConfig(128, 64, 64, 1, 8, 3), TileConfig(128, 64, 128, 1, 8, 3),
    TileConfig(128, 128, 64, 1, 8, 3), TileConfig(64, 64, 64, 1, 4, 4), TileConfig(128, 128, 64, 1, 8, 4),
    TileConfig(128, 64, 64, 1, 4, 4), TileConfig(256, 64, 64, 1, 8, 3), TileConfig(64, 64, 64, 1, 4, 3, 128),
    TileConfig(128, 64, 64, 1, 8, 3, 128), TileConfig(64, 32, 64, 1, 4, 3),
    TileConfig(128, 64, 128, 1, 8, 3, 128, 1), TileConfig(128, 64, 64, 1, 8, 3, 128, 1),
    TileConfig(64, 64, 64, 1, 4, 3, 128, 1),
]
MOE_DOWN = [  # the down kernel's own tile, tried at the best gate+up tile's block_m
    TileConfig(128, 64, 64, 1, 8, 3), TileConfig(256, 64, 64, 1, 8, 3), TileConfig(128, 64, 64, 1, 8, 4),
    TileConfig(128, 32, 64, 1, 8, 3), TileConfig(64, 16, 128, 2, 4, 4), TileConfig(64, 16, 256, 2, 4, 3),
    TileConfig(128, 16, 128, 2, 8, 4),
    TileConfig(256, 64, 64, 1, 8, 3, 0, 3), TileConfig(128, 64, 64, 1, 8, 3, 0, 3),
    TileConfig(128, 64, 128, 1, 8, 3, 0, 3),
]
MOE_DECODE = [  # decode paths at one token: GEMV tiles (block_m 1) and MMA tiles (one block per assignment)
    TileConfig(16, 1, 256, 1, 4, 3), TileConfig(16, 1, 512, 1, 4, 3), TileConfig(32, 1, 256, 1, 4, 3),
    TileConfig(8, 1, 512, 1, 4, 3), TileConfig(16, 1, 1024, 1, 8, 3),
    TileConfig(64, 16, 128, 1, 4, 4), TileConfig(64, 16, 256, 1, 4, 3), TileConfig(32, 16, 256, 1, 4, 3),
    TileConfig(32, 16, 128, 1, 4, 4), TileConfig(64, 16, 512, 1, 4, 2),
]


def gemv_config(n: int, k: int, m: int, rows: int, loads: int, warps: int = 4, stages: int = 2,
                split: int = 1) -> TileConfig:
    """A GEMV config by what it changes: programs (rows each), loads in flight per thread per step,
    program width (warps), steps in flight (num_stages: 2 register prefetch, >= 3 cp.async pipeline;
    1 where there is a single step), split K."""
    chunks = max(1, loads // rows)
    bk = min(configs.GEMV_THREADS_K * warps * chunks, 1 << (k - 1).bit_length())
    steps = -(-k // (bk * split))
    return TileConfig(rows, configs.m_bucket(m), bk, split, warps, stages if steps > 1 else 1)


def gemv_candidates(n: int, k: int, groups: int, m: int, sm_count: int) -> list[TileConfig]:
    """First sweep: rows per program x loads per thread (4 warps, register prefetch), the default
    first, then by how close the program count is to ~6 per SM (a cut-off sweep has tried the likely
    ones); rows that leave SMs without a program, or (M > 1) 16-row tiles, are skipped."""
    out = []
    for rows in GEMV_ROWS:
        if (n // groups) % rows or n // rows < sm_count or (m > 1 and rows > 8):
            continue
        for loads in GEMV_LOADS:
            if loads >= rows and (m == 1 or loads <= 8):
                out.append(gemv_config(n, k, m, rows, loads))
    out.sort(key=lambda c: abs(math.log2(n / c.block_n / (6 * sm_count))))
    return list(dict.fromkeys([configs.default_gemv(n, k, m, sm_count), *out]))


def gemv_refinements(best: TileConfig, n: int, k: int, m: int) -> list[TileConfig]:
    """Second sweep around the first sweep's winner: the other pipelining modes (multi-step only),
    2 / 8 warps at the same loads per thread, split K doubled."""
    chunks = best.block_k // (configs.GEMV_THREADS_K * best.num_warps)
    loads = best.block_n * max(1, chunks)
    out = []
    if best.num_stages > 1:
        out += [replace(best, num_stages=st) for st in (1, 2, 3, 4)]
    for warps in (2, 8):
        out.append(gemv_config(n, k, m, best.block_n, loads, warps, best.num_stages, best.split_k))
    out.append(gemv_config(n, k, m, best.block_n, loads, best.num_warps, best.num_stages, 2 * best.split_k))
    return [c for c in dict.fromkeys(out) if c != best]


def pdl_candidates(base: TileConfig, n: int, k: int, m: int, sm_count: int) -> list[TileConfig]:
    """A GEMV config (`base`, else the default GEMV where `base` is a tiled one) without and with
    programmatic dependent launch, and under PDL with register prefetch (num_stages 2), whose first
    step's weights load before the wait for the previous kernel."""
    base = replace(base, pdl=0) if configs.is_gemv(base) else configs.default_gemv(n, k, m, sm_count)
    return list(dict.fromkeys([base, replace(base, pdl=1), replace(base, pdl=1, num_stages=2)]))


def pdl_works() -> bool:
    """Whether PDL launches capture and replay in a CUDA graph with the results of plain launches (run it
    in a child process, `check_pdl`: a failed capture can leave its CUDA context unusable)."""
    torch.manual_seed(0)
    w = torch.randn(1024, 2048, device="cuda").to(torch.float8_e4m3fn)
    s = torch.full((32, 64), 120, dtype=torch.uint8, device="cuda")
    prepared = linear.prepare_linear("fp8", w, s)
    x = torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16)
    cfg = replace(configs.default_gemv(1024, 2048, 1), num_stages=2)
    want = linear.block_linear(x, prepared, torch.float32, cfg)
    try:
        got = graph_results(lambda: linear.block_linear(x, prepared, torch.float32, replace(cfg, pdl=1)))
    except Exception as e:
        print(f"PDL in CUDA graphs: {type(e).__name__}: {str(e)[:200]}", flush=True)
        return False
    return bool(torch.equal(got, want))


def graph_results(fn):
    """fn's result, captured in a CUDA graph (3 calls back to back) and replayed."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [fn() for _ in range(3)]
    graph.replay()
    torch.cuda.synchronize()
    return outs[-1]


def check_pdl() -> bool:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        ok = pool.submit(pdl_works).result()
    print(f"PDL launches in CUDA graphs: {'ok' if ok else 'not used'}", flush=True)
    return ok


def tiled_candidates(n: int, k: int, m: int) -> list[TileConfig]:
    base = configs.default("fp8", n, k, m)
    if m > 64:
        return [TileConfig(bn, bm, configs.block_k(k, bk), 1, w, s) for bn, bm, bk, w, s in LARGE_M]
    out = []
    for bn, bk, w, s in SMALL_M:
        for split in {max(1, base.split_k // 2), base.split_k, base.split_k * 2}:
            out.append(TileConfig(bn, base.block_m, configs.block_k(k, bk), split, w, s))
    return out


def time_linear(x, prepared, cfg: TileConfig, m: int) -> float:
    if m <= 64:
        wbytes = prepared.weight.numel() + prepared.scale.numel()
        copies = max(1, min(32, -(-3 * L2_BYTES // wbytes)))
        calls = rotating_calls(lambda p: linear.block_linear(x, p, torch.bfloat16, cfg), prepared, copies)
        return graph_ms(calls)
    return eager_ms(lambda: linear.block_linear(x, prepared, torch.bfloat16, cfg), 30)


def _sweep(x, prepared, cfgs: list[TileConfig], m: int, deadline: float) -> list[tuple[float, TileConfig]]:
    results = []
    for cfg in cfgs:
        if time.time() > deadline:
            break
        try:
            results.append((time_linear(x, prepared, cfg, m), cfg))
        except Exception as e:  # a config the compiler rejects (resources): skip it
            print(f"  {cfg}: {type(e).__name__}: {str(e)[:120]}", flush=True)
    return results


def _summary(results: list[tuple[float, TileConfig]]) -> str:
    return ", ".join(f"{c.block_n}/{c.block_m}/{c.block_k}/{c.split_k}/{c.num_warps}w/{c.num_stages}s "
                     f"{t * 1e3:.1f}" for t, c in results)


def tune_linears(table: dict, deadline: float, tokens: tuple[int, ...],
                 only: list[str] | None = None, gemv1: bool = False, pdl: bool = False) -> None:
    """Every FP8 shape (or those whose name contains one of `only`) at each M, the target points (1, 4096)
    first and with 3x the time share of the others. Up to 8 tokens the GEMV is swept (two rounds) and
    the tiled kernel at the table's config timed next to it: the faster is stored (a GEMV config has
    block_m < 16). `pdl`: the GEMV winner under programmatic dependent launch too; `gemv1`: at M = 1 only
    the table's entry (the incumbent, whichever kernel) against GEMVs under PDL."""
    shapes = {(n, k, groups, kind): name for name, (n, k, groups, kind) in FLASH_LINEARS.items()
              if kind != "dense" and (only is None or any(part in name for part in only))}
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    points = [(m, shape) for m in sorted(tokens, key=lambda m: (m not in (1, 4096), m)) for shape in shapes]
    weights = [3 if m in (1, 4096) else 1 for m, _ in points]
    for i, (m, (n, k, groups, kind)) in enumerate(points):
        if time.time() > deadline:
            print(f"time budget spent: {len(points) - i} (shape, M) points not tuned", flush=True)
            return
        share = time.time() + (deadline - time.time()) * weights[i] / sum(weights[i:])
        weight, scale = make_weight(n, k, groups, kind)
        prepared = linear.prepare_linear(kind, weight, scale, groups)
        x = torch.randn(m, groups * k, device="cuda", dtype=torch.bfloat16)
        name = f"{shapes[(n, k, groups, kind)]} M={m}"
        if kind == "fp8" and m == 1 and gemv1:
            incumbent = configs.lookup(kind, n, k, m, x.device)
            more = pdl_candidates(incumbent, n, k, m, sm_count) if pdl else []
            results = _sweep(x, prepared, list(dict.fromkeys([incumbent, *more])), m, float("inf"))
        elif kind == "fp8" and m <= 8:
            results = _sweep(x, prepared, gemv_candidates(n, k, groups, m, sm_count), m, share)
            if results:
                best = min(results, key=lambda r: r[0])[1]
                results += _sweep(x, prepared, gemv_refinements(best, n, k, m), m, share)
                if pdl:
                    best = min(results, key=lambda r: r[0])[1]
                    more = [c for c in pdl_candidates(best, n, k, m, sm_count) if c != best]
                    results += _sweep(x, prepared, more, m, share)
            tiled = configs.lookup(kind, n, k, m, x.device)  # the tiled kernel as the table serves it
            if configs.is_gemv(tiled):
                tiled = configs.default(kind, n, k, max(m, configs.GEMV_M + 1))
            results += _sweep(x, prepared, [tiled], m, float("inf"))
        else:
            results = _sweep(x, prepared, tiled_candidates(n, k, m), m, share)
        if not results:
            continue
        best_t, best = min(results, key=lambda r: r[0])
        table[configs.key(kind, n, k, m)] = best
        print(f"{name}: {best} {best_t * 1e3:.1f} us; all: {_summary(results)}", flush=True)
        del weight, scale, prepared
        torch.cuda.empty_cache()


def tune_moe_decode(table: dict, ours, deadline: float) -> None:
    """The decode path at one token: GEMV tiles against MMA tiles (one block per assignment)."""
    h, i, k = FLASH["hidden"], FLASH["inter"], FLASH["topk"]
    x = torch.randn(1, h, device="cuda", dtype=torch.bfloat16)
    w, ids = moe.route(moe.router_logits(x, ours.gate), ours.bias, ours.bias_vl, None, k, 2.5)
    call = functools.partial(moe.routed_experts, x, w, ids, ours.experts, 10.0)
    results = []
    for cfg in MOE_DECODE:
        if time.time() > deadline:
            break
        moe.DECODE_OVERRIDE = cfg
        try:
            results.append((graph_ms([call]), cfg))
        except Exception as err:  # a config the compiler rejects (resources): skip it
            print(f"  {cfg}: {type(err).__name__}: {str(err)[:120]}", flush=True)
        finally:
            moe.DECODE_OVERRIDE = None
    if not results:
        return
    best_t, best = min(results, key=lambda r: r[0])
    table[configs.key("moe-decode", h, i, 1)] = best
    summary = ", ".join(f"{c.block_n}/{c.block_m}/{c.block_k}/{c.num_warps}w/{c.num_stages}s {tt * 1e3:.1f}"
                        for tt, c in results)
    print(f"moe decode T=1: {best} {best_t * 1e3:.1f} us; all: {summary}", flush=True)


def tune_moe(table: dict, deadline: float, tokens: tuple[int, ...]) -> None:
    ours, _ = flash_layers(**FLASH)
    h, i, k, e = FLASH["hidden"], FLASH["inter"], FLASH["topk"], FLASH["experts"]
    for t in tokens:
        if time.time() > deadline:
            return
        if t * k <= moe.DECODE_ASSIGNMENTS:  # the decode path (GEMV or MMA kernels), tuned at one token
            tune_moe_decode(table, ours, deadline)
            continue
        x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
        w, ids = moe.route(moe.router_logits(x, ours.gate), ours.bias, ours.bias_vl, None, k, 2.5)
        max_bm = max(16, 2 * configs.m_bucket(t * k // e))  # larger blocks than an expert's rows only pad
        results = []
        for cfg in MOE:
            if cfg.block_m > max_bm or time.time() > deadline:
                continue
            try:
                results.append((_time_moe(x, w, ids, ours.experts, cfg, t), cfg))
            except Exception as err:  # a config the compiler rejects (resources): skip it
                print(f"  {cfg}: {type(err).__name__}: {str(err)[:120]}", flush=True)
        if not results:
            return
        best_t, best = min(results, key=lambda r: r[0])
        table[configs.key("moe", h, i, t * k)] = best
        down_key = configs.key("moe-down", h, i, t * k)
        table.pop(down_key, None)  # an earlier tune's entry may not fit the new gate+up tile (block_m, TMA)
        down_t, down = best_t, best
        for cfg in MOE_DOWN:  # the down kernel's own tile (same block_m: one alignment)
            boxed = cfg.tma & moe.TMA_ACTS and not best.tma  # boxed activations need the TMA gate+up
            if cfg.block_m == best.block_m and cfg != best and not boxed and time.time() < deadline:
                try:
                    took = _time_moe(x, w, ids, ours.experts, best, t, cfg)
                except Exception as err:  # a config the compiler rejects (resources): skip it
                    print(f"  down {cfg}: {type(err).__name__}: {str(err)[:120]}", flush=True)
                    continue
                down_t, down = min((down_t, down), (took, cfg), key=lambda r: r[0])
        if down != best:
            table[down_key] = down
        summary = ", ".join(f"{c.block_n}/{c.block_m}/{c.block_k}/{c.split_k}/{c.num_warps}w/{c.maxnreg} "
                            f"{tt * 1e3:.0f}" for tt, c in results)
        print(f"moe T={t}: {best} {best_t * 1e3:.1f} us, down {down} {down_t * 1e3:.1f} us; all: {summary}",
              flush=True)


def _time_moe(x, w, ids, experts, cfg: TileConfig, t: int, down: TileConfig | None = None) -> float:
    """The routed experts' time with tile `cfg` (the down kernel at `down`, else `cfg`)."""
    def call():
        return moe.routed_experts(x, w, ids, experts, 10.0, cfg, down)

    return graph_ms([call]) if t <= 256 else eager_ms(call, 60)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None, help="default: the package's file for this GPU")
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="linear M values to tune")
    ap.add_argument("--no-moe", action="store_true", help="tune the linears only")
    ap.add_argument("--shapes", default=None, help="comma-separated parts of linear names: only those shapes")
    ap.add_argument("--moe-tokens", default="1,64,256,1024,4096,16384",
                    help="MoE batch sizes to tune (1: the decode path)")
    ap.add_argument("--moe-share", type=float, default=0.4, help="share of the budget for the MoE")
    ap.add_argument("--gemv1", action="store_true",
                    help="FP8 at M=1: only the table's entry against GEMVs under PDL (where PDL works)")
    args = ap.parse_args()
    path = args.out or configs.gpu_file()
    deadline = time.time() + args.budget_s
    table = configs.load(path)
    try:
        if not args.no_moe:
            tune_moe(table, time.time() + args.budget_s * args.moe_share,
                     tuple(int(t) for t in args.moe_tokens.split(",")))
        only = args.shapes.split(",") if args.shapes else None
        tokens = tuple(int(t) for t in args.tokens.split(","))
        pdl = min(tokens) <= 8 and check_pdl()
        tune_linears(table, deadline, tokens, only, args.gemv1, pdl)
    finally:  # also on SIGINT (timeout -s INT): keep what was tuned
        configs.save(path, table)
        print(f"wrote {len(table)} configs to {path}", flush=True)


if __name__ == "__main__":
    main()
