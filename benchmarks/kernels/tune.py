"""Tile-config sweep for the block-scaled linears and the MoE expert GEMMs at Flash shapes; writes the
per-GPU JSON that deepinfer_kernels_cuda.configs reads (no autotuning at serve time).
Entries not re-tuned keep their values. Usage (GPU):
python3 benchmarks/kernels/tune.py [--out FILE] [--budget-s 150] [--tokens 1,4096] [--no-moe]"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path

import torch
from common import eager_ms
from linear import L2_BYTES, make_weight, rotating_calls
from moe import FLASH, flash_layers
from roofline import FLASH_LINEARS, TOKENS, graph_ms

from deepinfer_kernels_cuda import configs, linear, moe
from deepinfer_kernels_cuda.configs import TileConfig

GEMV = [  # M <= GEMV_M (FP8): (block_n, num_warps, num_stages: 2 prefetches a step); block_k =
    # GEMV_THREADS_K x num_warps; split-K swept at the default and twice it
    (8, 4, 1), (4, 4, 1), (8, 2, 1), (8, 4, 2), (4, 4, 2), (8, 2, 2),
]
SMALL_M = [  # (block_n, block_k, num_warps, num_stages), split-K swept around the default
    (64, 256, 4, 4), (64, 128, 4, 6), (128, 256, 8, 3), (64, 512, 4, 3),
]
LARGE_M = [  # (block_n, block_m, block_k, num_warps, num_stages)
    (128, 128, 64, 8, 3), (128, 64, 64, 4, 4), (128, 128, 128, 8, 3), (128, 256, 64, 8, 3),
    (256, 128, 64, 8, 3),
]
MOE = [
    TileConfig(64, 16, 128, 1, 4, 4), TileConfig(64, 16, 256, 1, 4, 3), TileConfig(128, 16, 128, 1, 8, 3),
    TileConfig(64, 32, 128, 1, 4, 4), TileConfig(128, 64, 64, 1, 8, 3), TileConfig(128, 64, 128, 1, 8, 3),
    TileConfig(128, 128, 64, 1, 8, 3), TileConfig(64, 64, 64, 1, 4, 4), TileConfig(128, 128, 64, 1, 8, 4),
    TileConfig(128, 64, 64, 1, 4, 4), TileConfig(256, 64, 64, 1, 8, 3),
]
MOE_DECODE = [  # decode paths at one token: GEMV tiles (block_m 1) and MMA tiles (one block per assignment)
    TileConfig(16, 1, 256, 1, 4, 3), TileConfig(16, 1, 512, 1, 4, 3), TileConfig(32, 1, 256, 1, 4, 3),
    TileConfig(8, 1, 512, 1, 4, 3), TileConfig(16, 1, 1024, 1, 8, 3),
    TileConfig(64, 16, 128, 1, 4, 4), TileConfig(64, 16, 256, 1, 4, 3), TileConfig(32, 16, 256, 1, 4, 3),
    TileConfig(32, 16, 128, 1, 4, 4), TileConfig(64, 16, 512, 1, 4, 2),
]


def candidates(n: int, k: int, m: int) -> list[TileConfig]:
    base = configs.default("fp8", n, k, m)
    if m > 64:
        return [TileConfig(bn, bm, configs.block_k(k, bk), 1, w, s) for bn, bm, bk, w, s in LARGE_M]
    out = []
    if m <= configs.GEMV_M:  # one 8-column chunk per thread per K step
        for bn, w, stages in GEMV:
            for split in (base.split_k, base.split_k * 2):
                out.append(TileConfig(bn, base.block_m, configs.GEMV_THREADS_K * w, split, w, stages))
        return out
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


def tune_linears(table: dict, deadline: float, tokens: tuple[int, ...]) -> None:
    seen = set()
    for name, (n, k, groups, kind) in FLASH_LINEARS.items():
        if kind == "dense" or (n, k, groups) in seen:
            continue
        seen.add((n, k, groups))
        weight, scale = make_weight(n, k, groups, kind)
        prepared = linear.prepare_linear(kind, weight, scale, groups)
        for m in sorted(tokens, key=lambda m: (m not in (1, 4096), m)):  # the target points first
            if time.time() > deadline:
                return
            x = torch.randn(m, groups * k, device="cuda", dtype=torch.bfloat16)
            results = []
            for cfg in candidates(n, k, m):
                if (n // groups) % cfg.block_n:
                    continue
                try:
                    results.append((time_linear(x, prepared, cfg, m), cfg))
                except Exception as e:  # a config the compiler rejects (resources): skip it
                    print(f"  {cfg}: {type(e).__name__}: {str(e)[:120]}", flush=True)
            best_t, best = min(results, key=lambda r: r[0])
            table[configs.key(kind, n, k, m)] = best
            print(f"{name} M={m}: {best} {best_t * 1e3:.1f} us", flush=True)


def tune_moe_decode(table: dict, ours, deadline: float) -> None:
    """The decode path at one token: GEMV tiles against MMA tiles (one block per assignment)."""
    h, i, k = FLASH["hidden"], FLASH["inter"], FLASH["topk"]
    x = torch.randn(1, h, device="cuda", dtype=torch.bfloat16)
    w, ids = moe.route(moe.router_logits(x, ours.gate), ours.bias, ours.bias_vl, None, k, 2.5)
    results = []
    for cfg in MOE_DECODE:
        if time.time() > deadline:
            break
        if cfg.block_m == 1:
            call = functools.partial(moe.routed_experts_decode, x, w, ids, ours.experts, 10.0, cfg)
        else:
            mlp = moe._Mlp(*(getattr(ours.experts, n) for n in ("w1", "s1", "w3", "s3", "w2", "s2")),
                           False, 1, True, ours.experts.asm)
            call = functools.partial(moe._grouped_mlp, x, w, ids, mlp, FLASH["experts"], i, 10.0, cfg, True)
        try:
            results.append((graph_ms([call]), cfg))
        except Exception as err:  # a config the compiler rejects (resources): skip it
            print(f"  {cfg}: {type(err).__name__}: {str(err)[:120]}", flush=True)
    if not results:
        return
    best_t, best = min(results, key=lambda r: r[0])
    table[configs.key("moe-decode", h, i, 1)] = best
    gemv = min((r for r in results if r[1].block_m == 1), key=lambda r: r[0], default=(None, None))[1]
    if gemv is not None:
        table[configs.key("moe-gemv", i, h, 1)] = table[configs.key("moe-gemv", h, i, 1)] = gemv
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
        summary = ", ".join(f"{c.block_n}/{c.block_m}/{c.block_k}/{c.num_warps}w {tt * 1e3:.0f}"
                            for tt, c in results)
        print(f"moe T={t}: {best} {best_t * 1e3:.1f} us; all: {summary}", flush=True)


def _time_moe(x, w, ids, experts, cfg: TileConfig, t: int) -> float:
    def call():
        return moe.routed_experts(x, w, ids, experts, 10.0, cfg)

    return graph_ms([call]) if t <= 256 else eager_ms(call, 60)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None, help="default: the package's file for this GPU")
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="linear M values to tune")
    ap.add_argument("--no-moe", action="store_true", help="tune the linears only")
    ap.add_argument("--moe-tokens", default="1,64,256,1024,4096,16384",
                    help="MoE batch sizes to tune (1: the decode path)")
    ap.add_argument("--moe-share", type=float, default=0.4, help="share of the budget for the MoE")
    args = ap.parse_args()
    path = args.out or configs.gpu_file()
    deadline = time.time() + args.budget_s
    table = configs.load(path)
    try:
        if not args.no_moe:
            tune_moe(table, time.time() + args.budget_s * args.moe_share,
                     tuple(int(t) for t in args.moe_tokens.split(",")))
        tune_linears(table, deadline, tuple(int(t) for t in args.tokens.split(",")))
    finally:  # also on SIGINT (timeout -s INT): keep what was tuned
        configs.save(path, table)
        print(f"wrote {len(table)} configs to {path}", flush=True)


if __name__ == "__main__":
    main()
