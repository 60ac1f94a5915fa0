"""mHC kernels at Flash width (m 4, H 5120) against the reference op: time and achieved bandwidth.

    python benchmarks/kernels/mhc.py [--out table.md]
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from common import backends, bench_ms, copy_bandwidth_gbs, emit, parse_out

from deepinfer.ops import Ops

M, H = 4, 5120


def cases(t: int, ref: Ops) -> dict[str, tuple[Callable[[Ops], object], int]]:
    """Op name -> (call on an op set, bytes it must move: inputs read once, outputs written once)."""
    fn = torch.randn(M * (M + 2), M * H, device="cuda") * (M * H) ** -0.5
    base, scale = torch.randn(M * (M + 2), device="cuda"), torch.rand(3, device="cuda")
    streams = torch.randn(t, M, H, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(t, H, device="cuda", dtype=torch.bfloat16)
    pre, post, comb = ref.hc_coefficients(streams, fn, base, scale, 20, 1e-6, 1e-6)
    return {
        "hc_coefficients": (lambda o: o.hc_coefficients(streams, fn, base, scale, 20, 1e-6, 1e-6),
                            streams.nbytes + fn.nbytes + t * M * (M + 2) * 4),
        "hc_collapse": (lambda o: o.hc_collapse(streams, pre), streams.nbytes + y.nbytes),
        "hc_expand": (lambda o: o.hc_expand(y, streams, post, comb), y.nbytes + 2 * streams.nbytes),
    }


def main() -> None:
    out = parse_out(__doc__)
    cuda, ref = backends()
    copy = copy_bandwidth_gbs()
    rows = []
    for t in (1, 64, 2048):
        for name, (call, nbytes) in cases(t, ref).items():
            k_ms, r_ms = bench_ms(lambda c=call: c(cuda)), bench_ms(lambda c=call: c(ref))
            gbs = nbytes / k_ms / 1e6
            rows.append([name, t, k_ms * 1e3, r_ms * 1e3, r_ms / k_ms, gbs, f"{100 * gbs / copy:.0f}%"])
    emit(f"mHC, m={M}, H={H}, bf16 streams (copy bandwidth {copy:.0f} GB/s)",
         ["op", "T", "cuda µs", "reference µs", "speedup", "GB/s", "% of copy"], rows, out)


if __name__ == "__main__":
    main()
