"""Decode of the Flash-width slice eagerly and through CUDA graphs, several batch sizes on one set of weights.

For each `--batch B:PREFILL` (default 1:2048 and 64:512): reference_forward.py's timed passes, eager
(no layer timer) then graphs: decode ms/step (host metadata build + launch + the GPU, one synchronous
step after another) and the GPU time of back-to-back replays; then the CUDA kernels of one eager decode
step by total GPU time (torch.profiler), i.e. what a replay spends its time in.

    python benchmarks/decode_graphs.py [--layers 5 --batch 1:2048 64:512 --decode 8 --json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from reference_forward import _ops, random_weights, run, token_map

from deepinfer.models.deepseek_v41.runtime import DeepseekV41Runtime, RuntimeOptions, build_runtime
from deepinfer.models.interface import ForwardBatch, SequenceSegment
from deepinfer.testing.configs import flash_slice_config


def kernel_table(runtime: DeepseekV41Runtime, batch: int, prefill: int, decode: int, top: int) -> list[dict]:
    """Kernels of an eager run of run()'s last decode step (its cache, its tables), by total GPU time."""
    graphs, runtime.graphs = runtime.graphs, None
    blocks = -(-(prefill + decode) // runtime.cache_layout().block_size)
    position = prefill + decode - 1
    segs = [SequenceSegment(s, list(range(1 + (s - 1) * blocks, 1 + s * blocks)), position, [5])
            for s in range(1, batch + 1)]
    runtime.forward(ForwardBatch(segs))  # same shapes as the profiled step: nothing left to compile
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        runtime.forward(ForwardBatch(segs))
        torch.cuda.synchronize()
    runtime.graphs = graphs
    kernels = [e for e in prof.key_averages() if e.device_time_total > 0]
    kernels.sort(key=lambda e: e.device_time_total, reverse=True)
    total = sum(e.device_time_total for e in kernels)
    rows = [{"kernel": e.key[:90], "calls": e.count, "us": e.device_time_total} for e in kernels[:top]]
    return [{"kernel": "all kernels", "calls": sum(e.count for e in kernels), "us": total}, *rows]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=5)
    p.add_argument("--batch", nargs="+", default=["1:2048", "64:512"], help="BATCH:PREFILL pairs")
    p.add_argument("--decode", type=int, default=8)
    p.add_argument("--top", type=int, default=25, help="kernels listed per batch")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    device = torch.device("cuda")
    config = flash_slice_config(num_layers=args.layers)
    t0 = time.perf_counter()
    runtime = build_runtime(config, random_weights(config, device), dtype=torch.bfloat16,
                            ops=_ops("cuda", device), engram_token_map=token_map(config),
                            options=RuntimeOptions(cache_precision="release"))
    results: dict = {"build_s": time.perf_counter() - t0, "gpu": torch.cuda.get_device_name(device)}
    results["runs"] = []
    for pair in args.batch:
        batch, prefill = (int(v) for v in pair.split(":"))
        eager = run(runtime, device, batch, prefill, args.decode, graphs=False, layers=False)
        graphs = run(runtime, device, batch, prefill, args.decode, graphs=True)
        step = {
            "batch": batch, "prefill": prefill,
            "eager_ms": eager["decode_s"] * 1e3 / args.decode,
            "graphs_ms": graphs["decode_s"] * 1e3 / args.decode,
            "replay_gpu_ms": graphs["graph_replay_ms"],
            "prefill_tok_s": graphs["prefill_tok_s"],
            "kernels": kernel_table(runtime, batch, prefill, args.decode, args.top),
        }
        results["runs"].append(step)
        print(f"batch {batch}: decode eager {step['eager_ms']:.2f} ms/step, graphs {step['graphs_ms']:.2f} "
              f"ms/step, replay GPU {step['replay_gpu_ms']}")
        for k in step["kernels"]:
            print(f"  {k['us']:9.1f} us {k['calls']:5d}x  {k['kernel']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
