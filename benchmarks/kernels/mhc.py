"""mHC kernels at Flash width (m 4, H 5120). First hc_coefficients side by side, graph-timed, with the
largest deviation from the reference: the default, batch-invariant mode and a baseline module's
`hc_coefficients` (--baseline FILE, e.g. an earlier mhc.py); then each fused op against the two ops it
replaces (graph-timed); then every op against the reference op: time and achieved bandwidth.

    python benchmarks/kernels/mhc.py [--tokens 1,64,2048] [--baseline FILE] [--out table.md] [--prefill]

--prefill: only the variants table and the split path's configs at the largest size (a prefill).
"""

from __future__ import annotations

import argparse
import functools
import runpy
from collections.abc import Callable
from pathlib import Path

import torch
from common import OP_COLUMNS, Case, backends, copy_bandwidth_gbs, emit, graph_ms, input_sets, op_rows

from deepinfer_kernels_cuda import mhc

M, H, ITERS, EPS = 4, 5120, 20, 1e-6


def coefficient_args(t: int) -> tuple:
    fn = torch.randn(M * (M + 2), M * H, device="cuda") * (M * H) ** -0.5
    base, scale = torch.randn(M * (M + 2), device="cuda"), torch.rand(3, device="cuda")
    return torch.randn(t, M, H, device="cuda", dtype=torch.bfloat16), fn, base, scale, ITERS, EPS, EPS


def stream_args(t: int, with_comb: bool) -> tuple:
    streams = torch.randn(t, M, H, device="cuda", dtype=torch.bfloat16)
    pre_or_post = torch.rand(t, M, device="cuda")
    if not with_comb:
        return streams, pre_or_post
    y = torch.randn(t, H, device="cuda", dtype=torch.bfloat16)
    return y, streams, pre_or_post, torch.rand(t, M, M, device="cuda")


def residual_args(t: int) -> tuple:
    return torch.randn(t, H, device="cuda", dtype=torch.bfloat16), *coefficient_args(t)


def collapse_norm_args(t: int) -> tuple:
    return *stream_args(t, False), torch.rand(H, device="cuda", dtype=torch.bfloat16) + 0.5, EPS


def coefficient_bytes(t: int) -> int:
    return t * M * H * 2 + M * (M + 2) * M * H * 4 + t * M * (M + 2) * 4


def cases(t: int) -> dict[str, Case]:
    """Op -> (op getter, input maker, bytes it must move: inputs read once, outputs written once)."""
    streams = t * M * H * 2
    return {
        "hc_coefficients": (lambda o: o.hc_coefficients, lambda: coefficient_args(t), coefficient_bytes(t)),
        "hc_collapse": (lambda o: o.hc_collapse, lambda: stream_args(t, False), streams + t * H * 2),
        "hc_expand": (lambda o: o.hc_expand, lambda: stream_args(t, True), t * H * 2 + 2 * streams),
        "hc_collapse_norm": (lambda o: o.hc_collapse_norm, lambda: collapse_norm_args(t),
                             streams + t * H * 4),
        "hc_residual": (lambda o: o.hc_residual, lambda: residual_args(t),
                        coefficient_bytes(t) + t * H * 2 + 2 * streams),
    }


def fused_rows(sizes: list[int]) -> list[list[object]]:
    """[op, T, graph µs of the fused op, graph µs of the two ops it replaces, max |difference|]."""
    ops = backends()[0]

    def two_residual(y, streams, *rest):
        pre, post, comb = ops.hc_coefficients(streams, *rest)
        return ops.hc_expand(y, streams, post, comb), pre

    def two_norm(streams, pre, w, eps):
        return ops.rms_norm(ops.hc_collapse(streams, pre), w, eps)

    pairs = {"hc_residual": (ops.hc_residual, two_residual, residual_args, 2 * M * H * 2 + H * 2),
             "hc_collapse_norm": (ops.hc_collapse_norm, two_norm, collapse_norm_args, M * H * 2 + H * 4)}
    rows: list[list[object]] = []
    for t in sizes:
        for name, (fused, two, make, row_bytes) in pairs.items():
            sets = input_sets(lambda make=make, t=t: make(t), t * row_bytes + coefficient_bytes(t))
            got, want = fused(*sets[0]), two(*sets[0])
            got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
            err = max(float((a.float() - b.float()).abs().max()) for a, b in zip(got, want, strict=True))
            rows.append([name, t, graph_ms(fused, sets) * 1e3, graph_ms(two, sets) * 1e3, err])
            print(rows[-1], flush=True)
    return rows


def residual_config_rows(sizes: list[int]) -> list[list[object]]:
    """[columns per program, warps, T, graph µs] of hc_residual's latency kernel (T <= 64)."""
    default = mhc._RESIDUAL_BLOCK_H, mhc._RESIDUAL_WARPS
    rows: list[list[object]] = []
    for t in (t for t in sizes if t <= 64):
        sets = input_sets(lambda t=t: residual_args(t), t * (2 * M * H * 2 + H * 2) + coefficient_bytes(t))
        for block_h, warps in ((256, 1), (512, 1), (1024, 1), (1024, 2), (1024, 4)):
            mhc._RESIDUAL_BLOCK_H, mhc._RESIDUAL_WARPS = block_h, warps
            try:
                rows.append([block_h, warps, t, graph_ms(mhc.hc_residual, sets) * 1e3])
            finally:
                mhc._RESIDUAL_BLOCK_H, mhc._RESIDUAL_WARPS = default
            print(rows[-1], flush=True)
    return rows


def variant_rows(sizes: list[int], baseline: Callable | None) -> list[list[object]]:
    """[variant, T, graph µs, max |error| vs the reference] for each hc_coefficients variant."""
    ref = backends()[1].hc_coefficients
    variants = {"default": mhc.hc_coefficients,
                "batch-invariant": functools.partial(mhc.hc_coefficients, batch_invariant=True),
                # the Sinkhorn's share of the finish: one iteration instead of ITERS (its error is not a bug)
                "1 Sinkhorn iteration (timing only)": lambda *a: mhc.hc_coefficients(*a[:4], 1, *a[5:])}
    if baseline is not None:
        variants["baseline"] = baseline
    rows: list[list[object]] = []
    for t in sizes:
        sets = input_sets(lambda t=t: coefficient_args(t), coefficient_bytes(t))
        want = ref(*sets[0])
        for name, fn in variants.items():
            err = max(float((a - b).abs().max()) for a, b in zip(fn(*sets[0]), want, strict=True))
            rows.append([name, t, graph_ms(fn, sets) * 1e3, err])
            print(rows[-1], flush=True)
    return rows


_SPLIT_CONFIGS = [  # tile rows, columns per program, columns per step, warps, stages, columns per tensor-core
    # accumulation chain (0: the program's; the default first)
    (64, 256, 64, 4, 4, 0), (64, 1024, 64, 4, 4, 256), (64, 512, 64, 4, 4, 256), (64, 2048, 64, 4, 4, 256),
    (64, 128, 64, 4, 2, 0), (64, 1024, 64, 4, 4, 0), (64, 512, 64, 4, 4, 0), (64, 2048, 128, 4, 3, 0),
    (128, 1024, 64, 4, 4, 0), (128, 2048, 64, 8, 4, 0), (128, 1024, 128, 8, 3, 0),
]


def split_config_rows(t: int) -> list[list[object]]:
    """[tile config, finish rows, T, graph µs, max |error| vs the reference] of hc_coefficients on the
    split path (bf16 streams past 64 rows) for each tile config, and the finish's rows per program."""
    ref = backends()[1].hc_coefficients
    sets = input_sets(lambda: coefficient_args(t), coefficient_bytes(t))
    want = ref(*sets[0])
    default = dict(mhc._SPLIT_TILE), mhc._SPLIT_FINISH_ROWS
    configs = [(c, default[1]) for c in _SPLIT_CONFIGS] + [(_SPLIT_CONFIGS[0], r) for r in (4, 16, 32)]
    rows: list[list[object]] = []
    for (block_t, chunk, block_k, warps, stages, chain), finish in configs:
        mhc._SPLIT_TILE.update(BLOCK_T=block_t, K_CHUNK=chunk, BLOCK_K=block_k, num_warps=warps,
                               num_stages=stages, CHAIN=chain)
        mhc._SPLIT_FINISH_ROWS = finish
        try:
            err = max(float((a - b).abs().max())
                      for a, b in zip(mhc.hc_coefficients(*sets[0]), want, strict=True))
            rows.append([f"{block_t}x{block_k} /{chunk}{f' chains of {chain}' if chain else ''} w{warps} "
                         f"s{stages}", finish, t,
                         graph_ms(mhc.hc_coefficients, sets) * 1e3, err])
        finally:
            mhc._SPLIT_TILE.update(default[0])
            mhc._SPLIT_FINISH_ROWS = default[1]
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="also write the tables (markdown) here")
    ap.add_argument("--tokens", default="1,64,2048")
    ap.add_argument("--baseline", type=Path, help="a module file with hc_coefficients (an earlier mhc.py)")
    ap.add_argument("--prefill", action="store_true")
    args = ap.parse_args()
    sizes = [int(t) for t in args.tokens.split(",")]
    baseline = runpy.run_path(str(args.baseline))["hc_coefficients"] if args.baseline else None
    emit("hc_coefficients variants (graph-timed)", ["variant", "T", "graph µs", "max abs error vs reference"],
         variant_rows(sizes, baseline), args.out)
    if args.prefill:
        emit("hc_coefficients split path configs (graph-timed)",
             ["tile (rows x columns per step, columns per program, warps, stages)", "finish rows", "T",
              "graph µs", "max abs error vs reference"], split_config_rows(max(sizes)), args.out)
        return
    emit("fused ops vs the two ops they replace (graph-timed)",
         ["op", "T", "fused µs", "two ops µs", "max abs difference"], fused_rows(sizes), args.out)
    emit("hc_residual latency kernel configs (graph-timed)", ["columns", "warps", "T", "graph µs"],
         residual_config_rows(sizes), args.out)
    copy = copy_bandwidth_gbs()
    rows = op_rows(cases, sizes, copy)
    emit(f"mHC, m={M}, H={H}, bf16 streams (copy bandwidth {copy:.0f} GB/s)", ["op", "T", *OP_COLUMNS], rows,
         args.out)


if __name__ == "__main__":
    main()
