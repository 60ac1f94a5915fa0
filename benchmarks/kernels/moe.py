"""The MoE sub-layer at Flash widths (384 experts, top-6, H 5120, I 2304, shared FP8 expert): the cuda
backend's `moe` vs the reference op, against rooflines measured in the same run, for both expert
layouts (`fp4`: split-nibble FP4 as stored; `fp8`: re-encoded E4M3, twice the bytes). Bytes counted are
the weights the layer must read: the touched experts' packed FP4 + scales (%copy_fp4), or the bytes the
layout actually streams (%copy), plus the shared expert and the router.
Variants of `fp4`, by suffix (combinable): `-inv` batch-invariant mode (`moe(..., batch_invariant=True)`:
fixed tiles at every size); `-ops` the Triton integer FP4 decode instead of the packed PTX one
(`PreparedExperts.asm`); `-dBN_BM_BK_WARPS_STAGES` the decode path's tile forced (`moe.DECODE_OVERRIDE`;
BM 1: the GEMVs, 16: the MMA kernels with one block per assignment), else the table's;
`-gBN_BM_BK_WARPS_STAGES[_SPLIT[_MAXNREG[_TMA]]]` the grouped kernels' tile above the decode sizes (SPLIT 2:
the FP4 high nibbles in a second accumulator; MAXNREG: registers per thread; TMA: `TileConfig.tma`, the
TMA kernels' bits), `-h...` the same for the grouped
down kernel alone (default: the `-g` tile; same BM); `-uBN_BM_BK_WARPS_STAGES` the
fused decode path (shared expert in the routed launches, combine in the down kernel) with this down tile
(`moe.DECODE_DOWN_OVERRIDE`; its gate+up tile is the decode tile; a sixth number > 1: one program per
slot, the last to arrive combining), `-u0`
the unfused decode path; `-r`
the router's CUDA-core GEMV up to 10 tokens (`moe.ROUTER_GEMV_TOKENS`), `-r0` cuBLAS; `-s0` the shared
expert on the caller's stream (`moe.SHARED_STREAM` off; above the fused decode sizes). `base`: the `moe` of
the file `--baseline` names (an earlier moe.py, same weights). A variant that does
not apply at a size (a decode or fused override above DECODE_ASSIGNMENTS, a grouped tile below, or one
whose rows per block are not within half to twice the mean assignments per expert) is skipped there.
`--profile`: GPU time per kernel of every variant timed. `--probe`: first, the read rate of the batch-1
gate+up's access pattern alone (`probe`).
Usage (GPU): python3 benchmarks/kernels/moe.py --out DIR [--tokens 1,8,...] [--layouts fp4,fp8,fp4-inv]"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch
import triton
import triton.language as tl
from common import eager_ms
from roofline import TOKENS, graph_ms, rooflines, write

from deepinfer.checkpoint.formats import quantize_fp8
from deepinfer.ops.reference import linear as ref_linear
from deepinfer.ops.reference import moe as ref_moe
from deepinfer.ops.weights import MoEWeights
from deepinfer_kernels_cuda import linear, moe
from deepinfer_kernels_cuda.configs import TileConfig, m_bucket

FLASH = {"experts": 384, "topk": 6, "hidden": 5120, "inter": 2304}
REF_TOKENS = (1, 64, 1024)  # the reference runs every expert on every token: slow, a few points suffice


def flash_layers(experts: int, topk: int, hidden: int, inter: int) -> tuple[MoEWeights, MoEWeights]:
    """Random packed FP4 experts with realistic scale bytes (2^-9..2^-6), FP8 shared expert."""
    def fp4(rows, cols):
        w = torch.randint(0, 256, (experts, rows, cols // 2), dtype=torch.uint8, device="cuda")
        s = torch.randint(118, 122, (experts, rows, cols // 32), dtype=torch.uint8, device="cuda")
        return w, s.view(torch.float8_e8m0fnu)

    w1, w3, w2 = fp4(inter, hidden), fp4(inter, hidden), fp4(hidden, inter)
    shared = [quantize_fp8(torch.randn(*s, device="cuda") * 0.02)
              for s in ((inter, hidden), (inter, hidden), (hidden, inter))]
    bias, bias_vl = (torch.randn(2, experts, device="cuda") * 0.01).unbind()
    gate = (torch.randn(experts, hidden, device="cuda") * 0.02).bfloat16()
    common = dict(gate=gate, bias=bias, bias_vl=bias_vl, topk=topk, route_scale=2.5, swiglu_limit=10.0,
                  dtype=torch.bfloat16)

    def build(prep_e, prep_l):
        return MoEWeights(experts=prep_e(*w1, *w3, *w2), shared_w1=prep_l("fp8", *shared[0]),
                          shared_w3=prep_l("fp8", *shared[1]), shared_w2=prep_l("fp8", *shared[2]), **common)

    ours = build(moe.prepare_experts, linear.prepare_linear)
    return ours, build(ref_moe.prepare_experts, ref_linear.prepare_linear)


def fp8_layout(ours: MoEWeights, ref: MoEWeights) -> MoEWeights:
    """`ours` with its experts re-encoded as E4M3 (from the release bytes the reference holds)."""
    r = ref.experts
    return replace(ours, experts=moe.prepare_experts(r.w1, r.w1_scale, r.w3, r.w3_scale, r.w2, r.w2_scale,
                                                     fp8=True))


def variant(layout: str, fp4: MoEWeights, fp8: MoEWeights | None) -> tuple[MoEWeights, bool, object, object,
                                                                            object, object, int | None]:
    """(weights, batch_invariant, decode override, grouped tile, grouped down tile, fused-decode down
    override, router GEMV tokens) of a layout name (module docstring)."""
    base, *flags = layout.split("-")
    if base not in ("fp4", "fp8", "base"):
        raise ValueError(f"layout {layout!r}: expected fp4, fp8 or base with suffixes")
    weights = fp8 if base == "fp8" else fp4
    decode = grouped = grouped_down = down = router = None
    for flag in flags:
        if flag == "s0":
            continue  # read by `bench`
        if flag in ("r", "r0"):
            router = 10 if flag == "r" else 0
        elif flag == "ops":
            weights = replace(weights, experts=replace(weights.experts, asm=False))
        elif flag == "u0":
            down = False
        elif flag[0] in "dghu":
            bn, bm, bk, warps, stages, *extra = map(int, flag[1:].split("_"))
            tile = TileConfig(bn, bm, bk, extra[0] if extra else 1, warps, stages,
                              extra[1] if len(extra) > 1 else 0, extra[2] if len(extra) > 2 else 0)
            if flag[0] == "d":
                decode = tile
            elif flag[0] == "g":
                grouped = tile
            elif flag[0] == "h":
                grouped_down = tile
            else:
                down = tile
        elif flag != "inv":
            raise ValueError(f"layout {layout!r}: unknown suffix {flag!r}")
    if grouped_down is not None and (grouped is None or grouped.block_m != grouped_down.block_m):
        raise ValueError(f"layout {layout!r}: -h needs a -g tile of the same BM")
    return weights, "inv" in flags, decode, grouped, grouped_down, down, router


def bench(tokens: tuple[int, ...], roof: dict[str, float], dims: dict[str, int], out: Path,
          header: dict, layouts: list[str], profile: bool = False, baseline=None) -> None:
    ours, ref = flash_layers(**dims)
    fp8 = fp8_layout(ours, ref) if any(name.startswith("fp8") for name in layouts) else None
    rows = []
    for t in tokens:
        for layout in layouts:
            weights, inv, decode, grouped, grouped_down, down, router = variant(layout, ours, fp8)
            decoding = t * dims["topk"] <= moe.DECODE_ASSIGNMENTS
            mean = t * dims["topk"] / dims["experts"]
            if ((decode is not None or down is not None) and not decoding) or (grouped is not None and (
                    decoding or not mean / 2 <= grouped.block_m <= max(16, 2 * m_bucket(int(mean))))):
                continue
            moe.DECODE_OVERRIDE = decode
            moe.DECODE_DOWN_OVERRIDE = down
            moe.SHARED_STREAM = "s0" not in layout.split("-")
            router_tokens = moe.ROUTER_GEMV_TOKENS
            moe.ROUTER_GEMV_TOKENS = router_tokens if router is None else router
            lookup, lookup_down = moe.configs.lookup_moe, moe.configs.lookup_moe_down
            if grouped is not None:
                moe.configs.lookup_moe = partial(_fixed, grouped)
                moe.configs.lookup_moe_down = partial(_fixed, grouped_down or grouped)
            op = baseline.moe if layout.startswith("base") else moe.moe
            try:
                rows.append(_point(t, weights, ref, roof, dims, layout, inv, op))
                if profile:
                    kernel_times(weights, t, dims["hidden"], layout, inv, op)
            except Exception as err:  # one variant failing (compile, resources) keeps the others
                print(f"T={t} {layout}: {type(err).__name__}: {str(err)[:300]}", flush=True)
                continue
            finally:
                moe.DECODE_OVERRIDE = moe.DECODE_DOWN_OVERRIDE = None
                moe.SHARED_STREAM = True
                moe.ROUTER_GEMV_TOKENS = router_tokens
                moe.configs.lookup_moe, moe.configs.lookup_moe_down = lookup, lookup_down
            write(out, f"moe_e{dims['experts']}_k{dims['topk']}", rows, header)  # a time limit keeps what ran


def kernel_times(layer: MoEWeights, t: int, hidden: int, layout: str, inv: bool, op=moe.moe,
                 calls: int = 10) -> None:
    """GPU time per kernel of `op` (the variant's overrides in force) at t tokens, eager, mean over `calls`
    (torch.profiler)."""
    x = torch.randn(t, hidden, device="cuda", dtype=torch.bfloat16)
    op(x, layer, batch_invariant=inv)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            op(x, layer, batch_invariant=inv)
        torch.cuda.synchronize()
    events = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in events) / calls
    print(f"kernels at T={t} {layout}: {total:.1f} us per call", flush=True)
    for e in events[:10]:
        print(f"  {e.device_time_total / calls:9.1f} us  x{e.count // calls}  {e.key[:90]}", flush=True)


@triton.jit
def _probe_kernel(w, out_ptr, row_bytes, ROWS: tl.constexpr, BKB: tl.constexpr, MODE: tl.constexpr,
                  STAGES: tl.constexpr):
    """Program p reads rows p * ROWS .. + ROWS of a [rows, row_bytes] byte matrix, BKB columns a K step,
    as the batch-1 gate+up does, and stores a sum (the loads stay live). MODE 0: pointer loads (sm_90:
    16-byte cp.async past L1, where the gate+up's swizzled tiles take 8-byte ones through L1); 1: TMA
    boxes (w a descriptor); 2: the same bytes tile-major (each K step's ROWS x BKB bytes one contiguous
    run: the layout a load-time reorder would give). STAGES - 1 steps in flight."""
    pid = tl.program_id(0)
    r = tl.arange(0, ROWS)[:, None]
    c = tl.arange(0, BKB)[None, :]
    base = pid.to(tl.int64) * ROWS * row_bytes
    acc = tl.zeros((ROWS,), dtype=tl.int32)
    for k in tl.range(0, row_bytes, BKB, num_stages=STAGES):  # copies STAGES - 1 steps ahead
        if MODE == 1:
            tile = w.load([pid * ROWS, k])
        elif MODE == 2:
            tile = tl.load(w + base + k * ROWS + r * BKB + c)
        else:
            tile = tl.load(w + base + r * row_bytes + k + c)
        acc += tl.sum(tile.to(tl.int32), axis=1)
    tl.store(out_ptr + pid * ROWS + tl.arange(0, ROWS), acc)


def probe(roof: dict[str, float], dims: dict[str, int]) -> None:
    """Read rate of the batch-1 gate+up's routed weight stream without the decode and MMAs: 6 experts'
    gate and up rows (each program 2 x 64 rows of 2560 bytes, 128 bytes a K step; 4 copies rotate past
    L2), pointer / TMA / tile-major, 2-5 stages, and 64-row programs (twice as many). Far above the
    kernel's ~1.6 TB/s: the access pattern is not the limit; near it: a load-time tile-major layout
    or more bytes in flight is what gains."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    row_bytes, rows = dims["hidden"] // 2, dims["topk"] * 2 * dims["inter"]
    bufs = [torch.randint(0, 256, (rows, row_bytes), dtype=torch.uint8, device="cuda") for _ in range(4)]
    out = torch.empty(rows, dtype=torch.int32, device="cuda")
    for mode, name in ((0, "pointer"), (1, "tma"), (2, "tile-major")):
        for prog_rows, bkb, warps, stages in ((128, 128, 4, 2), (128, 128, 4, 3), (128, 128, 4, 4),
                                              (128, 128, 4, 5), (64, 128, 4, 4), (128, 256, 8, 3)):
            args = [TensorDescriptor.from_tensor(b, [prog_rows, bkb]) if mode == 1 else b for b in bufs]
            fns = [partial(_probe_kernel[(rows // prog_rows,)], a, out, row_bytes, ROWS=prog_rows, BKB=bkb,
                           MODE=mode, STAGES=stages, num_warps=warps) for a in args]
            try:
                ms = graph_ms(fns)
            except Exception as err:  # a variant out of resources keeps the others
                print(f"probe {name} {prog_rows}x{bkb} {warps}w {stages}s: {type(err).__name__}: "
                      f"{str(err)[:200]}", flush=True)
                continue
            tbs = rows * row_bytes / ms / 1e9
            pct = 100 * tbs / roof["copy_tbs"]
            print(f"probe {name:10s} rows {prog_rows:3d} x {bkb:3d} B, {warps}w {stages}s: "
                  f"{ms * 1e3:6.1f} us {tbs:.2f} TB/s = {pct:.0f}% of copy", flush=True)


def _fixed(cfg: TileConfig, *_: object) -> TileConfig:
    return cfg


def _point(t: int, ours: MoEWeights, ref: MoEWeights, roof: dict[str, float], dims: dict[str, int],
           layout: str, inv: bool, op=moe.moe) -> dict:
    e, k, h, i = dims["experts"], dims["topk"], dims["hidden"], dims["inter"]
    per_expert = 3 * h * i // 2 + 3 * h * i // 32
    streamed = 3 * h * i + 3 * h * i // 32 if layout.startswith("fp8") else per_expert
    run = partial(op, batch_invariant=inv)
    fixed = 3 * (h * i + h * i // 1024) + e * h * 2  # shared FP8 + scales, router
    x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
    got = run(x, ours)
    _, ids = moe.route(moe.router_logits(x, ours.gate), ours.bias, ours.bias_vl, None, k, 2.5)
    touched = int(torch.unique(ids).numel())
    te = eager_ms(lambda: run(x, ours), 100)
    tg = graph_ms([lambda: run(x, ours)]) if t <= 256 else None
    best = min(te, tg or te)
    t_ref, rel = None, None
    if t in REF_TOKENS and layout == "fp4":
        want = ref_moe.moe(x, ref)
        rel = float((got.float() - want.float()).norm() / want.float().norm())
        t_ref = eager_ms(lambda: ref_moe.moe(x, ref), 200)
    elif t in REF_TOKENS:  # the same function whatever the layout: check it, the reference is timed once
        want = ref_moe.moe(x, ref)
        rel = float((got.float() - want.float()).norm() / want.float().norm())
    moved = touched * per_expert + fixed + 2 * x.numel() * 2
    moved_layout = touched * streamed + fixed + 2 * x.numel() * 2
    flops = 2 * t * (k + 1) * 3 * h * i + 2 * t * h * e
    return {
        "tokens": t, "layout": layout, "touched": touched, "us": best * 1e3, "us_eager": te * 1e3,
        "TB/s": moved_layout / best / 1e9, "%copy": 100 * moved_layout / best / 1e9 / roof["copy_tbs"],
        "%copy_fp4": 100 * moved / best / 1e9 / roof["copy_tbs"],
        "TFLOP/s": flops / best / 1e9, "%bf16": 100 * flops / best / 1e9 / roof["bf16_tflops"],
        "%fp8": 100 * flops / best / 1e9 / roof["fp8_tflops"],
        "ref_us": t_ref * 1e3 if t_ref else None, "x_vs_ref": t_ref / best if t_ref else None,
        "rel_err": rel,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--experts", type=int, default=FLASH["experts"])
    ap.add_argument("--topk", type=int, default=FLASH["topk"])
    ap.add_argument("--layouts", default="fp4,fp8", help="expert layouts to time: fp4 (stored), fp8, fp4-inv")
    ap.add_argument("--invariant-config", default=None,
                    help="fp4-inv at this tile config, not moe.INVARIANT_CONFIG: BN,BM,BK,warps,stages")
    ap.add_argument("--rooflines", default=None,
                    help="an earlier run's ceilings, not measured again: COPY_TBS,BF16_TFLOPS,FP8_TFLOPS")
    ap.add_argument("--profile", action="store_true", help="then GPU time per kernel of the default path")
    ap.add_argument("--baseline", type=Path, default=None, help="an earlier moe.py (layout `base`)")
    ap.add_argument("--probe", action="store_true", help="first the batch-1 gate+up's read pattern alone")
    args = ap.parse_args()
    if args.invariant_config:
        bn, bm, bk, warps, stages = map(int, args.invariant_config.split(","))
        moe.INVARIANT_CONFIG = TileConfig(bn, bm, bk, 1, warps, stages)
    if args.rooflines:
        roof = dict(zip(("copy_tbs", "bf16_tflops", "fp8_tflops"), map(float, args.rooflines.split(","))))
        roof["rooflines_given"] = True
    else:
        roof = rooflines()
    dims = {**FLASH, "experts": args.experts, "topk": args.topk}
    header = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, **roof, **dims,
              "invariant_config": str(moe.INVARIANT_CONFIG),
              "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    print(header, flush=True)
    tokens = tuple(int(t) for t in args.tokens.split(","))
    baseline = None
    if args.baseline:
        spec = importlib.util.spec_from_file_location("moe_baseline", args.baseline)
        baseline = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
        spec.loader.exec_module(baseline)
    if args.probe:
        probe(roof, dims)
    bench(tokens, roof, dims, args.out, header, args.layouts.split(","), args.profile, baseline)


if __name__ == "__main__":
    main()
