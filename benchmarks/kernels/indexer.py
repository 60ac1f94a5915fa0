"""Lightning-indexer scores at Flash width (32 heads x 128, bf16) against the reference op.

N = compressed entries scored per query row: 4096 (8k context at ratio 2) and 32768 (64k context).
    python benchmarks/kernels/indexer.py [--out table.md]
"""

from __future__ import annotations

import torch
from common import backends, bench_ms, copy_bandwidth_gbs, emit, parse_out

HEADS, DIM = 32, 128


def main() -> None:
    out = parse_out(__doc__)
    cuda, ref = backends()
    copy = copy_bandwidth_gbs()
    rows = []
    for n in (4096, 32768):
        k = torch.randn(n, DIM, device="cuda", dtype=torch.bfloat16)
        for t in (1, 64, 2048):
            q = torch.randn(t, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(t, HEADS, device="cuda", dtype=torch.bfloat16)
            k_ms = bench_ms(lambda q=q, k=k, w=w: cuda.indexer_logits(q, k, w))
            r_ms = bench_ms(lambda q=q, k=k, w=w: ref.indexer_logits(q, k, w))
            nbytes = q.nbytes + k.nbytes + w.nbytes + t * n * 4
            tflops = 2 * t * HEADS * n * DIM / k_ms / 1e9
            gbs = nbytes / k_ms / 1e6
            rows.append([n, t, k_ms * 1e3, r_ms * 1e3, r_ms / k_ms, gbs, f"{100 * gbs / copy:.0f}%", tflops])
    emit(f"indexer_logits, {HEADS} heads x {DIM}, bf16 (copy bandwidth {copy:.0f} GB/s)",
         ["N", "T", "cuda µs", "reference µs", "speedup", "GB/s", "% of copy", "TFLOP/s"], rows, out)


if __name__ == "__main__":
    main()
