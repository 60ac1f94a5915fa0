"""Checkpoint load throughput on a real-size DeepSeek-V4.1-Flash slice, from the page cache.

Writes the slice once (full Flash widths: hidden 5120, 64 heads, FP8/FP4 release formats) into
--dir if it is not there, reads every file once to warm the page cache, then times
`load_checkpoint` in these modes:
  * mapped       - headers + shape/dtype checks, zero-copy views of the memory map, NaN/Inf scan of
                   every float, FP8 and scale tensor; packed FP4 expert bytes are mapped, not read;
  * mapped+read  - as above, then one read pass over every FP4 expert tensor too, so every byte of
                   the checkpoint has been read once (what a device upload adds);
  * materialized - (--materialize) every tensor copied into process memory; needs free RAM for the
                   page cache plus a second copy, else it measures page-cache eviction.

usage: python benchmarks/load_checkpoint.py [--dir DIR] [--layers 4] [--experts 48] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import torch

from deepinfer.checkpoint import load_checkpoint, write_checkpoint
from deepinfer.testing import flash_slice_config
from deepinfer.tokenizer.bundled import tokenizer_for


def _warm_page_cache(root: Path) -> float:
    t0 = time.perf_counter()
    n = 0
    for f in sorted(root.glob("*.safetensors")):
        with f.open("rb") as fh:
            while chunk := fh.read(64 << 20):
                n += len(chunk)
    return n / 1e9 / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", type=Path, default=Path("/tmp/deepinfer-flash-slice"))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--experts", type=int, default=48, help="routed experts per layer (Flash: 384)")
    parser.add_argument("--dspark-experts", type=int, default=16, help="DSpark routed experts (Flash: 128)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--materialize", action="store_true", help="also time materialize=True")
    args = parser.parse_args()

    config = flash_slice_config(
        num_layers=args.layers, n_routed_experts=args.experts, dspark_n_routed_experts=args.dspark_experts
    )
    if not (args.dir / "model.safetensors.index.json").exists():  # the writer's last file
        stats = write_checkpoint(config, args.dir, tokenizer=tokenizer_for(config), progress=True)
        print(f"wrote {stats.bytes / 1e9:.2f} GB in {stats.files} files in {stats.seconds:.0f} s")
    print(f"page-cache warm-up read: {_warm_page_cache(args.dir):.2f} GB/s")

    modes = ["mapped", "mapped+read"] + (["materialized"] if args.materialize else [])
    rows = []
    for mode in modes:
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            ck = load_checkpoint(args.dir, progress=False, materialize=mode == "materialized")
            if mode == "mapped+read":
                for name, spec in ck.specs.items():
                    if spec.kind == "fp4":
                        ck.tensors[name].view(torch.uint8).amax()
            rows.append((mode, ck.stats, time.perf_counter() - t0))
            del ck
    print(
        f"\nFlash slice: {args.layers} layers, {args.experts} experts/layer, hidden 5120; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.machine()}"
    )
    print(f"{'mode':<14} {'files':>5} {'tensors':>8} {'GB':>8} {'headers s':>10} {'total s':>8} {'GB/s':>7}")
    for mode, st, seconds in rows:
        print(
            f"{mode:<14} {st.files:>5} {st.tensors:>8} {st.bytes / 1e9:>8.2f} {st.header_seconds:>10.3f} "
            f"{seconds:>8.2f} {st.bytes / 1e9 / seconds:>7.2f}"
        )
    print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
