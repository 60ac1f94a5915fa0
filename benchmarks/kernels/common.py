"""Shared pieces of the kernel benchmarks: cold-L2 timing, the copy-bandwidth ceiling, tables."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch
import triton.testing

from deepinfer.ops import Ops, get_ops


def bench_ms(fn: Callable[[], object]) -> float:
    """Median time of fn in ms (device events; do_bench rewrites a 256 MB buffer first: cold L2)."""
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


def copy_bandwidth_gbs(gib: float = 2.0) -> float:
    """Device-to-device copy bandwidth (bytes read + written) on a buffer far larger than L2."""
    x = torch.randn(int(gib * 2**30) // 4, device="cuda")
    y = torch.empty_like(x)
    return 2 * x.numel() * 4 / bench_ms(lambda: y.copy_(x)) / 1e6


def backends() -> tuple[Ops, Ops]:
    """(cuda ops, reference ops), on the GPU."""
    return get_ops("cuda", "cuda"), get_ops("reference", "cuda")


def parse_out(description: str) -> Path | None:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here")
    return parser.parse_args().out


def emit(title: str, header: list[str], rows: list[list[object]], out: Path | None) -> None:
    """Print a markdown table (and append it to `out`)."""
    fmt = [f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    fmt += ["| " + " | ".join(f"{c:.4g}" if isinstance(c, float) else str(c) for c in r) + " |" for r in rows]
    text = "\n".join(fmt) + "\n"
    print(text, flush=True)
    if out is not None:
        with out.open("a") as f:
            f.write(text + "\n")
