"""Linear kernels at Flash shapes: the cuda backend's `linear` (default and batch-invariant mode, and
the path the default does not take at that M: tiled vs GEMV vs decode-once + cuBLAS) vs the reference op,
torch._scaled_mm on the same FP8 bytes and a BF16 F.linear on the dequantised weight, against rooflines
measured in the same run. Kernel times are CUDA-graph replays (us_eager: one eager call, host included).
Usage (GPU): python3 benchmarks/kernels/linear.py --out DIR [--tokens 1,8,...]
--decode: only the FP8 shapes at few tokens, graph-timed, against the copy bandwidth and the read floor
of the same bytes (`roofline.stream_floor`: the fastest plain read of them in one kernel), next to a
baseline module's `linear(x, prepared, out_dtype)` (--baseline FILE, e.g. an earlier kernel;
--baseline-table JSON: the config table it looks up, e.g. the earlier tune) -> linear_decode.*
--invariant: the batch-invariant base configs swept at M = 1 and written into the installed table (or
--table), then default vs invariant mode per M, bitwise checks, read floors, the decode-once path's parts
(and the baseline module's invariant mode with --baseline) -> linear_invariant.*, linear_invariant_sweep.*,
invariant_entries.json"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import importlib.util
import json
import math
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F
from common import copy_bandwidth_gbs, eager_ms
from roofline import FLASH_LINEARS, TOKENS, graph_ms, rooflines, stream_floor, write

from deepinfer.checkpoint.formats import quantize_fp8
from deepinfer.ops.reference import linear as ref_linear
from deepinfer_kernels_cuda import configs, linear

L2_BYTES = 60 << 20


def make_weight(n: int, k: int, groups: int, kind: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    return (w, None) if kind == "dense" else quantize_fp8(w)


def weight_bytes(weight: torch.Tensor, scale: torch.Tensor | None) -> int:
    return weight.numel() * weight.element_size() + (scale.numel() if scale is not None else 0)


def rotating_calls(fn, prepared, copies: int):
    """`copies` calls of fn over distinct clones of the prepared weight (beats the L2 in graph replays)."""
    clones = [prepared] + [
        linear.PreparedLinear(prepared.kind, prepared.weight.clone(),
                              None if prepared.scale is None else prepared.scale.clone(),
                              prepared.groups, prepared.out_features, prepared.in_features)
        for _ in range(copies - 1)
    ]
    return [functools.partial(fn, p) for p in clones]


def bench_shape(name: str, tokens: tuple[int, ...], roof: dict[str, float]) -> list[dict]:
    n, k, groups, kind = FLASH_LINEARS[name]
    weight, scale = make_weight(n, k, groups, kind)
    ours = linear.prepare_linear(kind, weight, scale, groups)
    ref = ref_linear.prepare_linear(kind, weight, scale, groups)
    w_deq = ref.dequantized(torch.bfloat16)
    rows = []
    for m in tokens:
        rows.append(_point(name, m, ours, ref, weight, w_deq, roof))
        print(rows[-1], flush=True)
    return rows


def _us(ms: float | None) -> float | None:
    return ms * 1e3 if ms else None


def _time(fn, prepared, wbytes: int) -> float:
    """ms per call of fn(prepared): graph replays (no launch gaps) over L2-busting weight copies."""
    copies = max(1, min(32, -(-3 * L2_BYTES // wbytes)))
    return graph_ms(rotating_calls(fn, prepared, copies))


def _alternative(kind: str, n: int, k: int, m: int, device: torch.device):
    """(name, fn(x, prepared, out_dtype)) of the path the default does not take at this M, or None:
    the tiled kernel where it decodes once for cuBLAS; up to 8 FP8 tokens the other of GEMV and tiled
    (the tiled kernel at its default config, the GEMV at the table's M=1 config or the GEMV default)."""
    if kind == "dense":
        return None
    if m >= configs.DEQUANT_M:
        return "tiled", linear.block_linear
    if kind != "fp8" or m > 8:
        return None
    if configs.is_gemv(configs.lookup(kind, n, k, m, device)):
        cfg = configs.default(kind, n, k, max(m, configs.GEMV_M + 1))
        return "tiled", lambda x, p, dt: linear.tiled_linear(x, p, dt, cfg)
    cfg = configs.lookup(kind, n, k, 1, device)
    if not configs.is_gemv(cfg):
        cfg = configs.default_gemv(n, k, m)
    return "gemv", lambda x, p, dt: linear.gemv_linear(x, p, dt, cfg)


def _point(name, m, ours, ref, weight, w_deq, roof) -> dict:
    n, k, groups, kind = FLASH_LINEARS[name]
    out_dtype = torch.float32 if kind == "dense" else torch.bfloat16
    wbytes = weight_bytes(ours.weight, ours.scale)
    x = torch.randn(m, groups * k, device="cuda", dtype=torch.bfloat16)
    got = linear.linear(x, ours, out_dtype)
    want = ref_linear.linear(x, ref, out_dtype) if m * n <= (1 << 31) // 8 else None
    rel = float((got.float() - want.float()).norm() / want.float().norm()) if want is not None else None
    t = eager_ms(lambda: linear.linear(x, ours, out_dtype))
    best = _time(lambda p: linear.linear(x, p, out_dtype), ours, wbytes)
    t_inv = _time(lambda p: linear.linear(x, p, out_dtype, batch_invariant=True), ours, wbytes)
    alt = _alternative(kind, n, k, m, x.device)
    t_alt = _time(lambda p: alt[1](x, p, out_dtype), ours, wbytes) if alt else None
    t_ref = None
    if want is not None and m <= 64:
        t_ref = eager_ms(lambda: ref_linear.linear(x, ref, out_dtype), 20)
    t_bf16 = eager_ms(lambda: F.linear(x[:, :k], w_deq[: n // groups]), 30) if groups == 1 else None
    t_peer = None
    if kind == "fp8":
        xq = torch.randn(max(16, m), k, device="cuda").to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        t_peer = eager_ms(lambda: torch._scaled_mm(xq, weight.t(), one, one, out_dtype=torch.bfloat16), 30)
    flops = 2 * m * n * k
    moved = wbytes + x.numel() * 2 + m * n * (4 if out_dtype == torch.float32 else 2)
    return {
        "shape": name, "M": m, "us": best * 1e3, "us_eager": t * 1e3,
        "TB/s": moved / best / 1e9, "%copy": 100 * moved / best / 1e9 / roof["copy_tbs"],
        "TFLOP/s": flops / best / 1e9, "%bf16": 100 * flops / best / 1e9 / roof["bf16_tflops"],
        "%fp8": 100 * flops / best / 1e9 / roof["fp8_tflops"],
        "inv_us": t_inv * 1e3, "inv_x": t_inv / best, "alt": alt[0] if alt else None, "alt_us": _us(t_alt),
        "ref_us": _us(t_ref), "scaled_mm_us": _us(t_peer), "bf16_linear_us": _us(t_bf16), "rel_err": rel,
    }


def _load_module(path: Path):
    spec = importlib.util.spec_from_file_location(f"baseline_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _config_table(path: Path | None):
    """Config lookups (at graph capture) read `path` instead of the package's table for this GPU."""
    if path is None:
        yield
        return
    gpu_file = configs.gpu_file
    configs.gpu_file = lambda device=None: path
    configs._entry.cache_clear()
    try:
        yield
    finally:
        configs.gpu_file = gpu_file
        configs._entry.cache_clear()


def _fp8_shape(name: str) -> tuple | None:
    """(N, K, groups, weight, scale, prepared, its bytes) of a Flash linear with FP8 weights, else None."""
    n, k, groups, kind = FLASH_LINEARS[name]
    if kind != "fp8":
        return None
    weight, scale = make_weight(n, k, groups, kind)
    prepared = linear.prepare_linear(kind, weight, scale, groups)
    return n, k, groups, weight, scale, prepared, weight_bytes(prepared.weight, prepared.scale)


def _run_header() -> tuple[float, dict]:
    """The same-run copy bandwidth (TB/s) and the table's header (GPU, that bandwidth, UTC time), printed."""
    copy_tbs = copy_bandwidth_gbs() / 1e3
    header = {"gpu": torch.cuda.get_device_name(), "copy_tbs": copy_tbs,
              "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    print(header, flush=True)
    return copy_tbs, header


def decode_table(out: Path, names: list[str], tokens: tuple[int, ...], baseline,
                 baseline_table: Path | None = None) -> None:
    """FP8 shapes at few tokens: the default path (GEMV or tiled, per the table) and the baseline, both
    graph-timed over L2-busting weight copies, %copy on the bytes moved, %floor = the same bytes' read
    floor over the time; rel_err vs the reference."""
    copy_tbs, header = _run_header()
    rows = []
    kind = "fp8"
    for name in names:
        if (shape := _fp8_shape(name)) is None:
            continue
        n, k, groups, weight, scale, ours, wbytes = shape
        ref = ref_linear.prepare_linear(kind, weight, scale, groups)
        floor = stream_floor(wbytes)
        header["empty_us"] = floor["empty_us"]
        for m in tokens:
            x = torch.randn(m, groups * k, device="cuda", dtype=torch.bfloat16)
            want = ref_linear.linear(x, ref, torch.bfloat16).float()
            cfg = configs.lookup(kind, n, k, m, x.device)
            moved = wbytes + x.numel() * 2 + m * n * 2
            row = {"shape": name, "M": m, "MB": wbytes / 2**20,
                   "path": "gemv" if configs.is_gemv(cfg) else "tiled",
                   "config": "/".join(map(str, dataclasses.astuple(cfg))),
                   "read_us": floor["read_us"], "copy_same_us": floor["copy_us"]}
            old = baseline.linear if baseline else None
            for tag, fn, table in (("new", linear.linear, None), ("old", old, baseline_table)):
                if fn is None:
                    continue
                with _config_table(table):
                    got = fn(x, ours, torch.bfloat16).float()
                    t = _time(lambda p, fn=fn, x=x: fn(x, p, torch.bfloat16), ours, wbytes)
                row[f"{tag}_us"] = t * 1e3
                row[f"{tag}_%copy"] = 100 * moved / t / 1e9 / copy_tbs
                row[f"{tag}_%floor"] = 100 * floor["read_us"] / (t * 1e3)
                row[f"{tag}_rel_err"] = float((got - want).norm() / want.norm())
            rows.append(row)
            print(row, flush=True)
        del shape, weight, scale, ours, ref
        torch.cuda.empty_cache()
        write(out, "linear_decode", rows, header)  # after every shape: a time limit keeps what ran


def _invariant_candidates(kind: str, n: int, k: int, sms: int) -> list[configs.TileConfig]:
    """Base batch-invariant configs to try at M = 1: K steps of 256 and 128 columns, each with the
    heuristic's split (`configs.default_invariant_linear`) and its neighbours, 4 stages."""
    out = []
    for bk in (256, 128):
        bk = configs.block_k(k, bk)
        steps = -(-k // bk)
        h = dataclasses.replace(configs.default_invariant_linear(kind, n, k, sms), block_k=bk)
        for split in sorted({max(1, h.split_k // 2), h.split_k, 2 * h.split_k, 4 * h.split_k}):
            if split <= steps and dataclasses.replace(h, split_k=split) not in out:
                out.append(dataclasses.replace(h, split_k=split))
    return out


@contextlib.contextmanager
def _invariant_base(cfg: configs.TileConfig | None):
    """Batch-invariant linears take `cfg` as every shape's base config (None: the table's)."""
    if cfg is None:
        yield
        return
    saved = configs.invariant_linear
    configs.invariant_linear = lambda *args, **kwargs: cfg
    try:
        yield
    finally:
        configs.invariant_linear = saved


GEMV_TRIES = ((16, 1024, 4, 2), (32, 512, 4, 2), (16, 2048, 8, 1))  # (rows, columns per step, warps,
# stages): GEMVs of more rows per program than the tuner tries, for short K


def invariant_table(out: Path, names: list[str], tokens: tuple[int, ...], table_path: Path,
                    baseline=None) -> None:
    """FP8 shapes: the batch-invariant base config swept at M = 1 (`_invariant_candidates`; one more
    stage count for the winner), the fastest written as "invariant-fp8:<N>x<K>:1" into `table_path`
    (then every later process on this machine uses it) and into OUT/invariant_entries.json; then at
    `tokens` the default and the invariant mode graph-timed (ratio inv_x), whether a probe row is bitwise
    the same alone and as row 0 of M rows, and at M >= DEQUANT_M the decode-once path's parts (the decode
    alone, cuBLAS alone on the decoded copy); old_inv_us: a baseline module's invariant mode (--baseline).
    At M = 1 also the read floor of the weight bytes
    (`roofline.stream_floor`) and, for K <= 2048, a few wide-row GEMV configs against the default."""
    copy_tbs, header = _run_header()
    table = configs.load(table_path)
    entries, rows, sweep = {}, [], []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    kind = "fp8"
    for name in names:
        if (shape := _fp8_shape(name)) is None:
            continue
        n, k, groups, _, _, ours, wbytes = shape
        probe = torch.randn(1, groups * k, device="cuda", dtype=torch.bfloat16)

        def inv(p, x):
            return linear.linear(x, p, torch.bfloat16, batch_invariant=True)

        old_us = {}
        if baseline is not None:  # before this shape's entry is written: the old code reads the same key
            for m in tokens:
                x = torch.randn(m, groups * k, device="cuda", dtype=torch.bfloat16)
                old = functools.partial(baseline.linear, x, out_dtype=torch.bfloat16, batch_invariant=True)
                old_us[m] = 1e3 * _time(lambda p, old=old: old(p), ours, wbytes)
        timed = []
        for cfg in _invariant_candidates(kind, n, k, sms):
            with _invariant_base(cfg):
                timed.append((_time(lambda p, x=probe: inv(p, x), ours, wbytes), cfg))
        best = min(timed, key=lambda t: t[0])[1]
        more = dataclasses.replace(best, num_stages=3)
        with _invariant_base(more):
            timed.append((_time(lambda p, x=probe: inv(p, x), ours, wbytes), more))
        best = min(timed, key=lambda t: t[0])[1]
        sweep += [{"shape": name, "config": "/".join(map(str, dataclasses.astuple(c)[:6])), "us": t * 1e3}
                  for t, c in timed]
        table[configs.key(f"invariant-{kind}", n, k, 1)] = best
        entries[configs.key(f"invariant-{kind}", n, k, 1)] = dataclasses.asdict(best)
        configs.save(table_path, table)
        (out / "invariant_entries.json").write_text(json.dumps(entries, indent=1))
        floor = stream_floor(wbytes)
        with _invariant_base(best):
            alone = inv(ours, probe)
            for m in tokens:
                x = torch.randn(m, groups * k, device="cuda", dtype=torch.bfloat16)
                x[0] = probe[0]
                moved = wbytes + x.numel() * 2 + m * n * 2
                t_def = _time(lambda p, x=x: linear.linear(x, p, torch.bfloat16), ours, wbytes)
                t_inv = _time(lambda p, x=x: inv(p, x), ours, wbytes)
                row = {"shape": name, "M": m, "base": "/".join(map(str, dataclasses.astuple(best)[:6])),
                       "default_us": t_def * 1e3, "inv_us": t_inv * 1e3, "inv_x": t_inv / t_def,
                       "old_inv_us": old_us.get(m),
                       "old_inv_x": old_us[m] / (t_def * 1e3) if old_us else None,
                       "bitwise": bool(torch.equal(inv(ours, x)[:1], alone)),
                       "def_%copy": 100 * moved / t_def / 1e9 / copy_tbs}
                if m == 1:
                    row["read_us"] = floor["read_us"]
                    row["def_%floor"] = 100 * floor["read_us"] / (t_def * 1e3)
                    row["inv_%floor"] = 100 * floor["read_us"] / (t_inv * 1e3)
                    if k <= 2048:
                        gemvs = []
                        for bn, bk, warps, stages in GEMV_TRIES:
                            cfg = configs.TileConfig(bn, 1, bk, 1, warps, stages)
                            try:
                                t = _time(lambda p, c=cfg, x=x: linear.gemv_linear(x, p, torch.bfloat16, c),
                                          ours, wbytes)
                            except Exception as err:  # a config that does not compile or fit
                                print("gemv", cfg, type(err).__name__, flush=True)
                                continue
                            gemvs.append((t, cfg))
                        if gemvs:
                            t, cfg = min(gemvs, key=lambda g: g[0])
                            row["gemv_try"] = "/".join(map(str, dataclasses.astuple(cfg)[:6]))
                            row["gemv_try_us"] = t * 1e3
                if m >= configs.DEQUANT_M:
                    dense = linear._decoded(ours, torch.bfloat16)
                    row["decode_us"] = _time(lambda p: linear._decoded(p, torch.bfloat16), ours, wbytes) * 1e3
                    row["cublas_us"] = _time(lambda p, x=x: linear.dense_linear(x, p, torch.bfloat16), dense,
                                             2 * wbytes) * 1e3
                    row["tiled_us"] = _time(lambda p, x=x: linear.block_linear(x, p, torch.bfloat16), ours,
                                            wbytes) * 1e3
                rows.append(row)
                print(row, flush=True)
        del shape, ours
        torch.cuda.empty_cache()
        cols = list(dict.fromkeys(c for r in rows for c in r))  # every row gets every column
        write(out, "linear_invariant", [{c: r.get(c) for c in cols} for r in rows], header)
        write(out, "linear_invariant_sweep", sweep, header)


# persistent TMA GEMV tries at M = 1: (rows per box, columns per K step, stages, programs per SM); boxes of
# 4-8 KB with 256-byte rows, ~40-50 KB of them in flight per SM
TMA_TRIES = ((32, 256, 4, 2), (16, 512, 4, 2), (8, 1024, 4, 2), (4, 2048, 4, 2), (8, 512, 4, 4),
             (16, 256, 4, 4), (16, 256, 6, 2), (4, 1024, 4, 4))


def tma_candidates(n: int, k: int, sms: int, count: int = 6) -> list[configs.TileConfig]:
    """The first `count` TMA_TRIES whose K step divides K, those whose row blocks come to within 10% of
    whole rounds over the SMs first (the programs split the blocks, so a partial round idles SMs)."""
    def uneven(bn: int) -> bool:
        rounds = n // bn / sms
        return rounds / math.ceil(rounds) < 0.9

    tries = sorted((t for t in TMA_TRIES if k % t[1] == 0), key=lambda t: uneven(t[0]))
    return [configs.TileConfig(bn, 1, bk, per_sm, 4, stages, tma=1)
            for bn, bk, stages, per_sm in tries[:count]]


def _m1_call(x: torch.Tensor, cfg: configs.TileConfig | None):
    """fn(prepared) at one token: the default path (cfg None) or the GEMV at cfg."""
    if cfg is None:
        return lambda p: linear.linear(x, p, torch.bfloat16)
    return lambda p: linear.gemv_linear(x, p, torch.bfloat16, cfg)


def _warm(name: str, cfgs: list[configs.TileConfig | None]) -> None:
    """Compiles `name`'s calls at `cfgs` (None: the table's path) into Triton's disk cache (run in child
    processes: the compiles of several shapes go side by side)."""
    n, k, groups, kind = FLASH_LINEARS[name]
    ours = linear.prepare_linear(kind, *make_weight(n, k, groups, kind), groups)
    x = torch.randn(1, groups * k, device="cuda", dtype=torch.bfloat16)
    for cfg in cfgs:
        _m1_call(x, cfg)(ours)
    torch.cuda.synchronize()


def _tma_row(tag: str, cfg: configs.TileConfig | None, x, ours, want, floor: dict, copy_tbs: float) -> dict:
    n, wbytes = ours.out_features, weight_bytes(ours.weight, ours.scale)
    fn = _m1_call(x, cfg)
    t = _time(fn, ours, wbytes)
    moved = wbytes + x.numel() * 2 + n * 2
    row = {"run": tag, "MB": wbytes / 2**20,
           "config": "/".join(map(str, dataclasses.astuple(cfg))) if cfg else "table", "us": t * 1e3,
           "%copy": 100 * moved / t / 1e9 / copy_tbs, "%floor": 100 * floor["read_us"] / (t * 1e3),
           "read_us": floor["read_us"], "rel_err": float((fn(ours).float() - want).norm() / want.norm())}
    print(row, flush=True)
    return row


def tma_table(out: Path, names: list[str], table_path: Path) -> None:
    """FP8 shapes at M = 1: the table's path (before), the persistent TMA GEMV at `tma_candidates` and the
    fastest again under PDL, graph-timed over L2-busting weight copies, against the copy bandwidth and the
    read floor of the same bytes (same run). A TMA config faster than the table's path is written into
    `table_path` as the shape's M = 1 entry (and OUT/tma_entries.json), and the default path timed again."""
    copy_tbs, header = _run_header()
    out.mkdir(parents=True, exist_ok=True)  # tma_entries.json is written before the first table
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = {name: FLASH_LINEARS[name] for name in names if FLASH_LINEARS[name][3] == "fp8"}
    names = sorted(shapes, key=lambda name: -math.prod(shapes[name][:3]))  # the largest (the target) first
    tries = {name: tma_candidates(*FLASH_LINEARS[name][:2], sms) for name in names}
    pdl = {name: [dataclasses.replace(c, pdl=1) for c in cfgs] for name, cfgs in tries.items()}
    with ProcessPoolExecutor(min(8, 2 * len(names)), mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_warm, names + names, [[None, *tries[n]] for n in names] + [pdl[n] for n in names]))
    stream_floor(1 << 20)  # its kernels compiled before the first timing
    table = configs.load(table_path)
    rows, entries = [], {}
    kind = "fp8"
    for name in names:
        n, k, groups, weight, scale, ours, wbytes = _fp8_shape(name)
        ref = ref_linear.prepare_linear(kind, weight, scale, groups)
        x = torch.randn(1, groups * k, device="cuda", dtype=torch.bfloat16)
        args = (x, ours, ref_linear.linear(x, ref, torch.bfloat16).float(), stream_floor(wbytes), copy_tbs)
        before = _tma_row("before", None, *args)
        timed = [(_tma_row("tma", cfg, *args), cfg) for cfg in tries[name]]
        best, cfg = min(timed, key=lambda rc: rc[0]["us"])
        twin = dataclasses.replace(cfg, pdl=1)
        timed.append((_tma_row("tma pdl", twin, *args), twin))
        best, cfg = min(timed, key=lambda rc: rc[0]["us"])
        shape_rows = [before] + [r for r, _ in timed]
        if best["us"] < before["us"]:
            table[configs.key(kind, n, k, 1)] = cfg
            entries[configs.key(kind, n, k, 1)] = dataclasses.asdict(cfg)
            configs.save(table_path, table)
            (out / "tma_entries.json").write_text(json.dumps(entries, indent=1))
            shape_rows.append(_tma_row("after", None, *args))
        rows += [{"shape": name, **r} for r in shape_rows]
        del weight, scale, ours, ref, args
        torch.cuda.empty_cache()
        write(out, "linear_tma", rows, header)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--shapes", default="", help="comma-separated subset of shape names (default all)")
    ap.add_argument("--decode", action="store_true", help="FP8 shapes at few tokens vs --baseline only")
    ap.add_argument("--baseline", type=Path, default=None, help="module file with linear(x, prepared, dt)")
    ap.add_argument("--baseline-table", type=Path, default=None, help="config JSON the baseline looks up")
    ap.add_argument("--invariant", action="store_true",
                    help="sweep the batch-invariant base configs into --table, then default vs invariant")
    ap.add_argument("--table", type=Path, default=None, help="--invariant/--tma: config JSON to write "
                    "(default: the installed package's file for this GPU)")
    ap.add_argument("--tma", action="store_true",
                    help="M = 1: the table's path vs the persistent TMA GEMV's tries; winners into --table")
    args = ap.parse_args()
    tokens = tuple(int(t) for t in args.tokens.split(","))
    names = [s for s in FLASH_LINEARS if not args.shapes or s in args.shapes.split(",")]
    if args.invariant:
        invariant_table(args.out, names, tokens, args.table or configs.gpu_file(),
                        _load_module(args.baseline) if args.baseline else None)
        return
    if args.tma:
        tma_table(args.out, names, args.table or configs.gpu_file())
        return
    if args.decode:
        decode_table(args.out, names, tokens, _load_module(args.baseline) if args.baseline else None,
                     args.baseline_table)
        return
    roof = rooflines()
    header = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, **roof,
              "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    print(header, flush=True)
    rows = []
    for name in names:
        rows += bench_shape(name, tokens, roof)
        torch.cuda.empty_cache()
        write(args.out, "linear", rows, header)  # after every shape: a time limit keeps what ran


if __name__ == "__main__":
    main()
