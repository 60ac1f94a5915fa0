"""Shared pieces of the kernel benchmarks: timing, the copy-bandwidth ceiling, tables.

Two times per op: `eager_ms` (one call per launch from Python, L2 flushed before each: what a step
without CUDA graphs sees, launch overhead included) and `graph_ms` (calls replayed from a CUDA graph
over enough distinct input sets that they do not fit in L2: the kernels' own time).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import triton.testing

from deepinfer.ops import Ops, get_ops


def eager_ms(fn: Callable[[], object], rep_ms: int = 50) -> float:
    """Median time of fn in ms (device events; do_bench rewrites a 256 MB buffer first: cold L2)."""
    return float(triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median"))


def input_sets(make: Callable[[], tuple], touched: int, budget: int = 256 * 2**20) -> list[tuple]:
    """Enough argument sets from `make` that one pass over them touches ~`budget` bytes (> L2)."""
    return [make() for _ in range(max(1, min(256, -(-budget // touched))))]


def graph_ms(call: Callable[..., object], sets: list[tuple], replays: int = 5) -> float:
    """Time per call in ms: one CUDA graph calls `call(*args)` for every set, replayed `replays` times."""
    for args in sets:  # compile and warm up outside the capture
        call(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for args in sets:
            call(*args)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / (replays * len(sets))


def copy_bandwidth_gbs(gib: float = 2.0) -> float:
    """Device-to-device copy bandwidth (bytes read + written) on a buffer far larger than L2."""
    x = torch.randn(int(gib * 2**30) // 4, device="cuda")
    y = torch.empty_like(x)
    return 2 * x.numel() * 4 / eager_ms(lambda: y.copy_(x)) / 1e6


def times_ms(kernel: Callable[..., object], reference: Callable[..., object], sets: list[tuple]):
    """(kernel graph time, kernel eager time, reference eager time) in ms, per call."""
    return graph_ms(kernel, sets), eager_ms(lambda: kernel(*sets[0])), eager_ms(lambda: reference(*sets[0]))


def backends() -> tuple[Ops, Ops]:
    """(cuda ops, reference ops), on the GPU."""
    return get_ops("cuda", "cuda"), get_ops("reference", "cuda")


# an op's case: (op getter, input maker, bytes the op must move)
Case = tuple[Callable[[Ops], Callable], Callable[[], tuple], int]
OP_COLUMNS = ["cuda graph µs", "cuda eager µs", "reference eager µs", "eager speedup", "GB/s (graph)",
              "% of copy"]


def op_rows(cases: Callable[[int], dict[str, Case]], sizes: Iterable[int], copy: float) -> list[list[object]]:
    """[op, size, *OP_COLUMNS] for every case of `cases(size)`: cuda against reference ops, bandwidth as a
    share of the copy bandwidth `copy` (GB/s). Each row is printed as measured: a cut-off run keeps them."""
    cuda, ref = backends()
    rows: list[list[object]] = []
    for size in sizes:
        for name, (op, make, nbytes) in cases(size).items():
            g_ms, e_ms, r_ms = times_ms(op(cuda), op(ref), input_sets(make, nbytes))
            gbs = nbytes / g_ms / 1e6
            rows.append([name, size, g_ms * 1e3, e_ms * 1e3, r_ms * 1e3, r_ms / e_ms, gbs,
                         f"{100 * gbs / copy:.0f}%"])
            print(rows[-1], flush=True)
    return rows


def parse_args(description: str, *flags: str) -> argparse.Namespace:
    """--out (also write the tables, markdown, to this file) and the script's own boolean flags."""
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="also write the tables (markdown) here")
    for flag in flags:
        parser.add_argument(flag, action="store_true")
    return parser.parse_args()


def emit(title: str, header: list[str], rows: list[list[object]], out: Path | None) -> None:
    """Print a markdown table (and append it to `out`)."""
    fmt = [f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    fmt += ["| " + " | ".join(f"{c:.4g}" if isinstance(c, float) else str(c) for c in r) + " |" for r in rows]
    text = "\n".join(fmt) + "\n"
    print(text, flush=True)
    if out is not None:
        with out.open("a") as f:
            f.write(text + "\n")
