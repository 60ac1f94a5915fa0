"""CUDA graphs vs eager steps on the Flash-width slice: decode, verification and the DSpark draft forward.

One set of random weights (release cache precision, bf16). For each `--batch B:PREFILL` (default 1:2048
and 64:512) the sequences are prefilled once; then every step kind runs from the same cache state
(each step starts at the prefill end, the next one overwrites it: a rollback), eagerly and through
graphs, timed as ms/step with the device synchronised after each step (host metadata build + launch +
GPU, as a synchronous engine step):
- decode: one token per sequence;
- verify K: 1 + K tokens per sequence, logits of every row (--drafts, default 3 5);
- verify uneven K: sequence i verifies i mod (K + 1) drafts (padded to 1 + K by the graphs);
- draft: the DSpark draft forward of every sequence.
First, `plan_graphs` for the largest batch and K (the memory it keeps out of a cache budget) and the
start-up capture of every planned graph of the first batch's cache (count, seconds, pool memory).

    python benchmarks/decode_graphs.py [--layers 5 --batch 1:2048 64:512 --drafts 3 5 --steps 10
                                        --json out.json]
    python benchmarks/decode_graphs.py --cpu-check   # the tiny `full` config on the CPU, a recorder that
                                                      # re-runs each step standing in for graphs
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable

import torch
from reference_forward import _ops

from deepinfer.checkpoint.randomize import dummy_token_map, random_weights
from deepinfer.models.deepseek_v41.graphs import CudaRecorder, DecodeGraphs, DraftGraphs
from deepinfer.models.deepseek_v41.runtime import DeepseekV41Runtime, RuntimeOptions, build_runtime
from deepinfer.models.interface import ForwardBatch, SequenceSegment
from deepinfer.testing.configs import flash_slice_config, tiny_config
from deepinfer.testing.recorder import rerun_recorder


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_ms(step: Callable[[], object], steps: int) -> float:
    """Mean ms of `steps` synchronised calls after two warm-up calls (the first may capture)."""
    for _ in range(2):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
        sync()
    return (time.perf_counter() - t0) * 1e3 / steps


class Bench:
    def __init__(self, runtime: DeepseekV41Runtime, batch: int, prefill: int, max_drafts: int) -> None:
        self.rt, self.batch, self.prefill = runtime, batch, prefill
        block = runtime.cache_layout().block_size
        blocks = -(-(prefill + max_drafts + 1) // block)
        runtime.allocate_cache(batch * blocks + 1, batch + 1)
        self.tables = {s: list(range(1 + (s - 1) * blocks, 1 + s * blocks)) for s in range(1, batch + 1)}
        gen = torch.Generator().manual_seed(0)
        for s, table in self.tables.items():  # one prompt at a time: the prefill peak stays small
            prompt = torch.randint(3, runtime.vocab_size, (prefill,), generator=gen).tolist()
            runtime.forward(ForwardBatch([SequenceSegment(s, table, 0, prompt)]))
        sync()
        self.graphs: tuple[DecodeGraphs | None, DraftGraphs | None] = (
            runtime.graphs, runtime.dspark.graphs if runtime.dspark else None)

    def use_graphs(self, on: bool) -> None:
        decode, draft = self.graphs if on else (None, None)
        self.rt.graphs = decode
        if self.rt.dspark is not None:
            self.rt.dspark.graphs = draft

    def step(self, drafts: list[int]) -> Callable[[], object]:
        """A step where sequence i brings 1 + drafts[i] tokens at the prefill end."""
        segs = [SequenceSegment(s, self.tables[s], self.prefill, [5] + [7] * k, "all" if k else "last")
                for s, k in zip(self.tables, drafts, strict=True)]
        return lambda: self.rt.forward(ForwardBatch(segs)).logits

    def draft(self) -> Callable[[], object]:
        slots, anchors, golden = list(self.tables), [self.prefill] * self.batch, [5] * self.batch
        return lambda: self.rt.dspark.draft(self.rt.cache, slots, anchors, golden)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=5)
    p.add_argument("--batch", nargs="+", default=["1:2048", "64:512"], help="BATCH:PREFILL pairs")
    p.add_argument("--drafts", nargs="+", type=int, default=[3, 5], help="K of the verification steps")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--json", default=None)
    p.add_argument("--cpu-check", action="store_true", help="dry run of every code path on the CPU")
    p.add_argument("--no-plan", action="store_true", help="no start-up capture (graphs captured lazily)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    kmax = max(args.drafts)
    if args.cpu_check:
        device, dtype, config = torch.device("cpu"), torch.float32, tiny_config("full")
        pairs, precision = [(1, 20), (3, 9)], "exact"
    else:
        device, dtype = torch.device("cuda"), torch.bfloat16
        config = flash_slice_config(num_layers=args.layers)
        pairs, precision = [tuple(int(v) for v in pair.split(":")) for pair in args.batch], "release"
    options = RuntimeOptions(cache_precision=precision, max_backtrack=kmax + 1)
    weights, ops = random_weights(config, device), _ops("cuda" if device.type == "cuda" else None, device)
    runtime = build_runtime(config, weights, dtype=dtype, ops=ops, engram_token_map=dummy_token_map(config),
                            options=options)
    if args.cpu_check:
        runtime.graph_recorder = rerun_recorder
    results: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                     "runs": []}

    def save() -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)

    # start-up capture, planned for the largest batch and K, with the first pair's cache
    t0 = time.perf_counter()
    try:
        if args.no_plan:
            raise RuntimeError("--no-plan")
        reserve = runtime.plan_graphs(max(b for b, _ in pairs), kmax, max(pf for _, pf in pairs) + kmax + 1)
    except Exception as exc:  # the step timings below do not depend on it
        results["plan_error"], reserve = f"{type(exc).__name__}: {exc}"[:300], 0
        runtime.graph_plan = None
    results["plan_s"], results["reserve_mib"] = time.perf_counter() - t0, reserve / 2**20
    for i, (batch, prefill) in enumerate(pairs):
        t0 = time.perf_counter()
        bench = Bench(runtime, batch, prefill, kmax)
        if i == 0 and not args.no_plan:
            recorder = runtime.graph_recorder
            decode, draft = bench.graphs
            results["startup"] = {
                "allocate_prefill_capture_s": time.perf_counter() - t0,
                "graphs": len(decode.graphs) + len(draft.graphs if draft else ()),
                "pool_mib": recorder.pool_bytes() / 2**20 if isinstance(recorder, CudaRecorder) else None,
                "outputs_mib": sum(t.nbytes for t in [*decode.outputs.values(),
                                                      *((draft.outputs or ()) if draft else ())]) / 2**20,
            }
            print(f"plan_graphs: {results['reserve_mib']:.0f} MiB kept ({results['plan_s']:.1f} s); "
                  f"start-up: {results['startup']}", flush=True)
            save()
            runtime.graph_plan = None  # the later pairs' caches capture lazily (first warm-up call)
        steps = {"decode": bench.step([0] * batch)}
        for k in args.drafts:
            steps[f"verify K={k}"] = bench.step([k] * batch)
        steps[f"verify uneven K<={kmax}"] = bench.step([j % (kmax + 1) for j in range(batch)])
        if runtime.dspark is not None:
            steps["draft"] = bench.draft()
        for name, step in steps.items():
            row = {"batch": batch, "prefill": prefill, "step": name}
            for mode in ("eager", "graphs"):
                bench.use_graphs(mode == "graphs")
                try:
                    row[f"{mode}_ms"] = timed_ms(step, args.steps)
                except Exception as exc:  # one failing kind must not lose the others' numbers
                    row[f"{mode}_error"] = f"{type(exc).__name__}: {exc}"[:300]
            bench.use_graphs(True)
            if "eager_ms" in row and "graphs_ms" in row:
                row["speedup"] = row["eager_ms"] / row["graphs_ms"]
            results["runs"].append(row)
            print(json.dumps(row), flush=True)
            save()
    if device.type == "cuda":
        results["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    save()


if __name__ == "__main__":
    main()
