"""Compressor update and compressed-cache writes of one KV-source layer (ratio 2, head_dim 512, index
keys 128, bf16 latents) against the reference ops, for 1, 64 and 2048 new tokens.

Per op: `compressor_update` over T rows (T / 2 completed groups, at least one; each group's first row
in the ring for T = 1), `cache_write` of the T / 2 entries' KV (NVFP4 release, raw bf16 exact) and
index keys (MXFP4 / raw bf16), and the window codec (FP8) that DSpark's ring writes use. The layer
line sums the three calls a KV-source layer makes (update, KV write, index-key write). Bandwidth
counts the bytes an op must touch (inputs read once, outputs written once, indices included), as a
share of the device-to-device copy bandwidth.

    python benchmarks/kernels/cache_write.py [--out table.md]
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from common import backends, copy_bandwidth_gbs, emit, input_sets, parse_args, times_ms

from deepinfer.cache.codecs import Codec
from deepinfer.ops import Ops

D, INDEX_D, RATIO, SLOTS, LC, E = 512, 128, 2, 64, 5, 64
CODECS = {
    "release": {"kv": Codec("nvfp4", D, torch.bfloat16), "index": Codec("mxfp4", INDEX_D, torch.bfloat16)},
    "exact": {"kv": Codec("raw", D, torch.bfloat16), "index": Codec("raw", INDEX_D, torch.bfloat16)},
}
WINDOW, WINDOW_OP = Codec("fp8", D, torch.bfloat16), "window (DSpark ring)"


def write_args(codec: Codec, n: int) -> tuple:
    blocks = n // E + 2
    pool = torch.zeros(blocks, E, codec.nbytes, dtype=torch.uint8, device="cuda")
    dest = torch.randperm(blocks * E, device="cuda")[:n]
    return pool, dest, torch.randn(n, codec.dim, device="cuda", dtype=torch.bfloat16), codec


def write_bytes(codec: Codec, n: int) -> int:
    return n * (codec.dim * 2 + codec.nbytes + 8)


def update_args(tokens: int) -> tuple:
    ring_rows, groups = SLOTS * LC, max(1, tokens // RATIO)
    state = torch.randn(SLOTS, LC, 2 * D, device="cuda").view(torch.uint8)
    gate_value = torch.randn(tokens, 2 * D, device="cuda")
    rows = torch.arange(groups * RATIO, device="cuda").view(groups, RATIO)
    sources = ring_rows + rows.clamp_max(tokens - 1)
    if tokens == 1:
        sources[0, 0] = 0  # decode: the group's first row is in the ring
    kept = min(tokens, LC)  # the ring keeps the last LC rows of the sequence
    dest = torch.arange(kept, device="cuda")
    src = torch.arange(tokens - kept, tokens, device="cuda")
    return gate_value, state, sources, dest, src


def update_bytes(tokens: int) -> int:
    groups, kept = max(1, tokens // RATIO), min(tokens, LC)
    return groups * RATIO * (2 * D * 4 + 8) + groups * D * 4 + kept * (2 * 2 * D * 4 + 16)


def cases(t: int, precision: str) -> dict[str, tuple[Callable[[Ops], Callable], Callable[[], tuple], int]]:
    """Op name -> (op getter, input maker, bytes it must touch)."""
    n = max(1, t // RATIO)
    writes = [("kv", CODECS[precision]["kv"], n), ("index keys", CODECS[precision]["index"], n)]
    if precision == "release":
        writes.append((WINDOW_OP, WINDOW, t))
    found = {"compressor_update": (lambda o: o.compressor_update, partial(update_args, t), update_bytes(t))}
    for name, codec, rows in writes:
        found[f"cache_write {name} {codec.format}"] = (
            lambda o: o.cache_write, partial(write_args, codec, rows), write_bytes(codec, rows))
    return found


def main() -> None:
    out = parse_args(__doc__).out
    cuda, ref = backends()
    copy = copy_bandwidth_gbs()
    rows = []
    for precision in CODECS:
        for t in (1, 64, 2048):
            layer = [0.0, 0.0, 0.0, 0]
            for name, (op, make, nbytes) in cases(t, precision).items():
                g_ms, e_ms, r_ms = times_ms(op(cuda), op(ref), input_sets(make, nbytes))
                gbs = nbytes / g_ms / 1e6
                rows.append([precision, name, t, g_ms * 1e3, e_ms * 1e3, r_ms * 1e3, r_ms / e_ms, gbs,
                             f"{100 * gbs / copy:.0f}%"])
                print(rows[-1], flush=True)  # the table comes at the end: keep what a cut-off run measured
                if WINDOW_OP not in name:
                    layer = [layer[0] + g_ms, layer[1] + e_ms, layer[2] + r_ms, layer[3] + nbytes]
            gbs = layer[3] / layer[0] / 1e6
            rows.append([precision, "**layer** (update + KV + index keys)", t, layer[0] * 1e3, layer[1] * 1e3,
                         layer[2] * 1e3, layer[2] / layer[1], gbs, f"{100 * gbs / copy:.0f}%"])
    emit(f"Compressor update and cache writes, one KV-source layer (copy bandwidth {copy:.0f} GB/s)",
         ["precision", "op", "new tokens", "cuda graph µs", "cuda eager µs", "reference eager µs",
          "eager speedup", "GB/s (graph)", "% of copy"], rows, out)


if __name__ == "__main__":
    main()
