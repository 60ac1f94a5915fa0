"""mHC kernels at Flash width (m 4, H 5120) against the reference op: time and achieved bandwidth.

    python benchmarks/kernels/mhc.py [--out table.md]
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from common import backends, copy_bandwidth_gbs, emit, input_sets, parse_args, times_ms

from deepinfer.ops import Ops

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


def cases(t: int) -> dict[str, tuple[Callable[[Ops], Callable], Callable[[], tuple], int]]:
    """Op -> (op getter, input maker, bytes it must move: inputs read once, outputs written once)."""
    streams = t * M * H * 2
    return {
        "hc_coefficients": (lambda o: o.hc_coefficients, lambda: coefficient_args(t),
                            streams + M * (M + 2) * M * H * 4 + t * M * (M + 2) * 4),
        "hc_collapse": (lambda o: o.hc_collapse, lambda: stream_args(t, False), streams + t * H * 2),
        "hc_expand": (lambda o: o.hc_expand, lambda: stream_args(t, True), t * H * 2 + 2 * streams),
    }


def main() -> None:
    out = parse_args(__doc__).out
    cuda, ref = backends()
    copy = copy_bandwidth_gbs()
    rows = []
    for t in (1, 64, 2048):
        for name, (op, make, nbytes) in cases(t).items():
            g_ms, e_ms, r_ms = times_ms(op(cuda), op(ref), input_sets(make, nbytes))
            gbs = nbytes / g_ms / 1e6
            pct = f"{100 * gbs / copy:.0f}%"
            rows.append([name, t, g_ms * 1e3, e_ms * 1e3, r_ms * 1e3, r_ms / e_ms, gbs, pct])
    emit(f"mHC, m={M}, H={H}, bf16 streams (copy bandwidth {copy:.0f} GB/s)",
         ["op", "T", "cuda graph µs", "cuda eager µs", "reference eager µs", "eager speedup", "GB/s (graph)",
          "% of copy"], rows, out)


if __name__ == "__main__":
    main()
