"""The machine's own ceilings, measured in the same run as a benchmark: copy bandwidth and bf16 matmul rate.

Only torch is needed, so GPU scripts that must run without our package installed can import it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def _seconds_per_call(fn: Callable[[], object], device: torch.device, iters: int) -> float:
    fn()  # warm-up: kernel selection, allocator
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) / iters


def copy_bandwidth_gbs(device: torch.device, nbytes: int, iters: int = 20) -> float:
    """Device-to-device copy, counting the bytes read and the bytes written (GB/s, 1e9)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / _seconds_per_call(lambda: dst.copy_(src), device, iters) / 1e9


def matmul_tflops(
    device: torch.device, n: int, dtype: torch.dtype = torch.bfloat16, iters: int = 20
) -> float:
    """Square n x n x n products (TFLOP/s, 1e12)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    return 2 * n**3 / _seconds_per_call(lambda: torch.mm(a, b, out=c), device, iters) / 1e12


def machine_peaks(device: torch.device) -> dict[str, float | int]:
    """GPU: 2 GiB copies and 8192^3 products (large enough to reach the plateau); CPU: small sizes."""
    nbytes, n = (2 << 30, 8192) if device.type == "cuda" else (64 << 20, 512)
    peaks: dict[str, float | int] = {
        "copy_bytes": nbytes,
        "copy_gb_s": copy_bandwidth_gbs(device, nbytes),
        "matmul_n": n,
        "bf16_matmul_tflop_s": matmul_tflops(device, n),
    }
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return peaks
