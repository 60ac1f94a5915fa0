"""mHC kernels at Flash width (m 4, H 5120) against the reference op: time and achieved bandwidth.

    python benchmarks/kernels/mhc.py [--out table.md]
"""

from __future__ import annotations

import torch
from common import OP_COLUMNS, Case, copy_bandwidth_gbs, emit, op_rows, parse_args

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


def cases(t: int) -> dict[str, Case]:
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
    copy = copy_bandwidth_gbs()
    rows = op_rows(cases, (1, 64, 2048), copy)
    emit(f"mHC, m={M}, H={H}, bf16 streams (copy bandwidth {copy:.0f} GB/s)", ["op", "T", *OP_COLUMNS], rows,
         out)


if __name__ == "__main__":
    main()
