"""Batch-invariant mode at prefill sizes, per kernel, in one process on the same weights: the default mode,
the invariant mode, the invariant mode at each tile variant it could take instead (`variant`), and with
--baseline DIR (linear.py / moe.py / mhc.py of an earlier tree, e.g. `git show main:<path>`) the
baseline's invariant mode. `x_default`: time over the default mode's; `bitwise`: a probe row alone equals
its row in the batch (the invariance contract; invariant rows only).

Parts: `linear` (the Flash FP8 linears; variants of `linear.INVARIANT_LARGE_TILES`), `moe` (the layer at
`--experts`, default 64 and 384: the cost benchmark's slice and Flash; variants of `moe.INVARIANT_PREFILL`,
the 16-token tiles of before, the shared expert's tiles; then the invariant layer's kernels), `mhc`
(hc_coefficients and hc_residual at 1 and 64 rows too: the invariant split path also serves decode).

    cd benchmarks/kernels && python3 invariant_prefill.py --out OUT [--tokens 4096,2048] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from common import eager_ms
from roofline import graph_ms, write

from deepinfer.checkpoint.formats import quantize_fp8
from deepinfer_kernels_cuda import linear, mhc, moe
from deepinfer_kernels_cuda.configs import TileConfig

# name -> (out rows, in columns per group, groups)
SHAPES = {"q_a+kv 5120->1792": (1792, 5120, 1), "kv 5120->512": (512, 5120, 1),
          "q_b+indexer q 1280->36864": (36864, 1280, 1), "o_a 8x(4096->1024)": (8 * 1024, 4096, 8),
          "o_b 8192->5120": (5120, 8192, 1)}
# invariant linear tiles past 64 tokens, each forced alone: (rows, tokens, K step, warps, stages)
LINEAR_VARIANTS = {"128x128 k64 s4": (128, 128, 64, 8, 4), "128x128 k64 s3": (128, 128, 64, 8, 3),
                   "128x64 k64 s4": (128, 64, 64, 8, 4), "128x256 k64 s3": (128, 256, 64, 8, 3),
                   "128x128 k128 s3": (128, 128, 128, 8, 3)}
MOE_VARIANTS = {  # name -> (module attribute, value)
    "down 128x64x128": ("_INVARIANT_FP4", {**moe._INVARIANT_FP4, 64: (
        moe.INVARIANT_PREFILL[0], TileConfig(128, 64, 128, 1, 8, 3, tma=1 | moe.TMA_ACTS))}),
    "pointer kernels": ("_INVARIANT_FP4", {**moe._INVARIANT_FP4, 64: moe._INVARIANT_FP4_POINTERS}),
    "shared 16-token tiles": ("INVARIANT_FP8", {bm: (moe.INVARIANT_CONFIG,) * 2 for bm in (16, 32, 64)}),
    "shared gate+up k64": ("INVARIANT_FP8", {**moe.INVARIANT_FP8, 64: (TileConfig(128, 64, 64, 1, 8, 3),
                                                                        moe.INVARIANT_FP8[64][1])}),
    "16-token tiles (before)": ("invariant_tiles", lambda *a: (moe.INVARIANT_CONFIG, moe.INVARIANT_CONFIG)),
}


@contextmanager
def patched(module, name: str, value) -> Iterator[None]:
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


def _bitwise(run: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, pos: int) -> bool:
    """Row `pos` of x alone gives bitwise its row of the whole batch."""
    return bool(torch.equal(run(x[pos:pos + 1])[0], run(x)[pos]))


# out directory, header and the rows so far: written after each row (a time limit keeps them)
_RUN: dict = {"rows": []}


def _row(part, case, tokens, variant, ms, default_ms, bitwise=None) -> None:
    row = {"part": part, "case": case, "tokens": tokens, "variant": variant, "us": ms * 1e3,
           "x_default": ms / default_ms, "bitwise": bitwise}
    print(row, flush=True)
    _RUN["rows"].append(row)
    write(_RUN["out"], "invariant_prefill", _RUN["rows"], _RUN["header"])


def _mode_rows(part: str, case: str, x: torch.Tensor, default: Callable, inv: Callable, variants: dict,
               baseline_op: Callable | None, reps: int) -> None:
    """One size's rows: the default mode, the invariant mode, the invariant mode with each variant's module
    attribute patched (name -> (module, attribute, value)) and, given, the baseline tree's op in its invariant
    mode; each invariant row with its probe (row m // 2 alone vs in the batch)."""
    m = x.shape[0]
    base = eager_ms(lambda: default(x), reps)
    _row(part, case, m, "default", base, base)
    _row(part, case, m, "invariant", eager_ms(lambda: inv(x), reps), base, _bitwise(inv, x, m // 2))
    for variant, (module, attr, value) in variants.items():
        with patched(module, attr, value):
            _row(part, case, m, variant, eager_ms(lambda: inv(x), reps), base, _bitwise(inv, x, m // 2))
    if baseline_op:
        def inv_baseline(v):
            return inv(v, baseline_op)

        _row(part, case, m, "baseline", eager_ms(lambda: inv_baseline(x), reps), base,
             _bitwise(inv_baseline, x, m // 2))


def linear_rows(tokens: list[int], baseline) -> None:
    for name, (n, k, groups) in SHAPES.items():
        w, s = quantize_fp8(torch.randn(n, k, device="cuda") / math.sqrt(k))
        p = linear.prepare_linear("fp8", w, s, groups)
        for m in tokens:
            x = torch.randn(m, groups * k, device="cuda", dtype=torch.bfloat16)

            def inv(v, op=linear.linear, p=p):
                return op(v, p, torch.bfloat16, batch_invariant=True)

            variants = {label: (linear, "INVARIANT_LARGE_TILES", (tile,))
                        for label, tile in LINEAR_VARIANTS.items()}
            _mode_rows("linear", name, x, lambda v, p=p: linear.linear(v, p, torch.bfloat16), inv, variants,
                       baseline.get("linear") and baseline["linear"].linear, 200)


def moe_rows(tokens: list[int], experts: list[int], baseline) -> None:
    spec = importlib.util.spec_from_file_location("moe_bench", Path(__file__).with_name("moe.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for e in experts:
        layer, _ = bench.flash_layers(e, 6, 5120, 2304)
        for m in tokens:
            x = torch.randn(m, 5120, device="cuda", dtype=torch.bfloat16)
            case = f"{e} experts"

            def inv(v, op=moe.moe, layer=layer):
                return op(v, layer, batch_invariant=True)

            variants = {label: (moe, attr, value) for label, (attr, value) in MOE_VARIANTS.items()}
            _mode_rows("moe", case, x, lambda v, layer=layer: moe.moe(v, layer), inv, variants,
                       baseline.get("moe") and baseline["moe"].moe, 400)
        bench.kernel_times(layer, max(tokens), 5120, f"inv {e} experts", True)
        del layer


def mhc_rows(tokens: list[int], baseline) -> None:
    m, h = 4, 5120
    fn = torch.randn(m * (m + 2), m * h, device="cuda") * (m * h) ** -0.5
    base_v, scale = torch.randn(m * (m + 2), device="cuda") * 0.5, torch.rand(3, device="cuda") + 0.5
    for t in [1, 64, *tokens]:
        streams = (torch.randn(t, m, h, device="cuda") * 3).bfloat16()
        y = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
        every, probe = slice(None), slice(t // 2, t // 2 + 1)
        for op_name in ("hc_coefficients", "hc_residual"):
            def run(rows, inv, module=mhc, op_name=op_name, streams=streams, y=y):
                args = (streams[rows], fn, base_v, scale, 20, 1e-6, 1e-6)
                if op_name == "hc_residual":
                    args = (y[rows], *args)
                out = getattr(module, op_name)(*args, batch_invariant=inv)
                return torch.cat([o.flatten(1).float() for o in out], 1)

            variants = {"default": (mhc, False), "invariant": (mhc, True)}
            if baseline.get("mhc"):
                variants["baseline"] = (baseline["mhc"], True)
            base = None
            for variant, (module, inv) in variants.items():
                ms = graph_ms([lambda run=run, module=module, inv=inv, every=every: run(every, inv, module)])
                base = base or ms
                alone, batch = run(probe, inv, module)[0], run(every, inv, module)[t // 2]
                _row("mhc", op_name, t, variant, ms, base, bool(torch.equal(alone, batch)) if inv else None)


def _baselines(directory: Path | None) -> dict:
    """The earlier tree's linear / moe / mhc modules found in `directory`, loaded by path."""
    found = {}
    for name in ("linear", "moe", "mhc"):
        path = directory / f"{name}.py" if directory else None
        if path and path.exists():
            spec = importlib.util.spec_from_file_location(f"{name}_baseline", path)
            module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
            spec.loader.exec_module(module)
            found[name] = module
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokens", default="4096,2048")
    ap.add_argument("--experts", default="64,384")
    ap.add_argument("--parts", default="mhc,moe,linear")
    ap.add_argument("--baseline", type=Path, default=None, help="directory of linear.py / moe.py / mhc.py")
    args = ap.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    header = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    print(header, flush=True)
    baseline = _baselines(args.baseline)
    _RUN.update(out=args.out, header=header)
    parts = {"linear": lambda: linear_rows(tokens, baseline), "mhc": lambda: mhc_rows(tokens, baseline),
             "moe": lambda: moe_rows(tokens, [int(e) for e in args.experts.split(",")], baseline)}
    for part in args.parts.split(","):
        parts[part]()


if __name__ == "__main__":
    main()
