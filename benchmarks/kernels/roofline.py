"""Graph timing and same-run rooflines of the linear/MoE benchmarks (copy bandwidth, BF16, FP8 peaks)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path

import torch
import triton
import triton.language as tl
from common import copy_bandwidth_gbs, eager_ms

# Flash widths (model spec): name -> (out rows N, in columns K per group, groups, weight kind)
FLASH_LINEARS: dict[str, tuple[int, int, int, str]] = {
    "q_a 5120->1280": (1280, 5120, 1, "fp8"),
    "q_a+kv 5120->1792": (1792, 5120, 1, "fp8"),  # wq_a and wkv stacked (one launch)
    "kv 5120->512": (512, 5120, 1, "fp8"),
    "q_b 1280->32768": (32768, 1280, 1, "fp8"),
    "q_b+indexer q 1280->36864": (36864, 1280, 1, "fp8"),  # stacked on layers with an indexer query
    "indexer q 1280->4096": (4096, 1280, 1, "fp8"),
    "o_a 8x(4096->1024)": (8192, 4096, 8, "fp8"),
    "o_b 8192->5120": (5120, 8192, 1, "fp8"),
    "shared w1 5120->2304": (2304, 5120, 1, "fp8"),
    "shared w2 2304->5120": (5120, 2304, 1, "fp8"),
    "lm_head 5120->129280": (129280, 5120, 1, "dense"),
}
TOKENS = (1, 8, 64, 256, 1024, 4096, 16384)


def graph_ms(fns: list[Callable[[], object]], reps: int = 20) -> float:
    """Per-call time of `fns` replayed back to back from one CUDA graph (no launch gaps); pass calls
    over rotating weight copies larger than L2 so the replay does not measure the cache."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / len(fns))
    return sorted(times)[len(times) // 2]


@triton.jit
def _read_kernel(src_ptr, out_ptr, BLOCK: tl.constexpr):
    """Reads BLOCK int32 words per program and stores one sum (so the loads are not dead)."""
    v = tl.load(src_ptr + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK))
    tl.store(out_ptr + tl.program_id(0), tl.sum(v, axis=0))


@triton.jit
def _empty_kernel():
    pass


READ_TILES = ((2048, 4), (8192, 8), (16384, 8))  # (words per program, warps): 8, 32 and 64 KB per program
L2_BYTES = 60 << 20


def stream_floor(nbytes: int) -> dict[str, float]:
    """What one kernel moving `nbytes` can reach at best, graph-timed over L2-busting buffers: `read_us`
    the fastest plain read of that many bytes (READ_TILES), `copy_us` torch's copy of them (reads and
    writes the bytes), `empty_us` an empty kernel's replay (launch and drain alone)."""
    copies = max(1, min(32, -(-3 * L2_BYTES // nbytes)))
    unit = 4 * max(words for words, _ in READ_TILES)
    size = -(-nbytes // unit) * unit  # whole programs of every tile: at most `unit` bytes more
    bufs = [torch.empty(size // 4, dtype=torch.int32, device="cuda") for _ in range(copies)]
    best = float("inf")
    for words, warps in READ_TILES:
        grid = size // 4 // words
        sums = torch.empty(grid, dtype=torch.int32, device="cuda")
        launch = _read_kernel[(grid,)]
        best = min(best, graph_ms([functools.partial(launch, b, sums, BLOCK=words, num_warps=warps)
                                   for b in bufs]))
    copy = graph_ms([functools.partial(torch.empty_like(b).copy_, b) for b in bufs])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    empty = graph_ms([_empty_kernel[(sms,)]] * 64)
    return {"read_us": best * 1e3, "copy_us": copy * 1e3, "empty_us": empty * 1e3}


def _mm_tflops(s: int = 8192) -> tuple[float, float]:
    x = torch.randn(s, s, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(s, s, device="cuda", dtype=torch.bfloat16)
    bf16 = eager_ms(lambda: x @ y)
    xf, yf = x.to(torch.float8_e4m3fn), y.to(torch.float8_e4m3fn).t().contiguous().t()
    one = torch.ones((), device="cuda")
    fp8 = eager_ms(lambda: torch._scaled_mm(xf, yf, one, one, out_dtype=torch.bfloat16))
    return 2 * s**3 / bf16 / 1e9, 2 * s**3 / fp8 / 1e9


def rooflines() -> dict[str, float]:
    """Copy bandwidth (TB/s, bytes read + written), BF16 and FP8 matmul peaks (TFLOP/s), random data."""
    copy = copy_bandwidth_gbs() / 1e3
    bf16, fp8 = _mm_tflops()
    torch.cuda.empty_cache()
    return {"copy_tbs": copy, "bf16_tflops": bf16, "fp8_tflops": fp8}


def write(out_dir: Path, name: str, rows: list[dict], header: dict) -> None:
    """rows -> <name>.json and a markdown table <name>.md (columns in the first row's order)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps({"header": header, "rows": rows}, indent=1))
    cols = list(rows[0]) if rows else []
    lines = [f"<!-- {json.dumps(header)} -->", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r[c]) for c in cols) + " |")
    (out_dir / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)
