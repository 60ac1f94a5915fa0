"""Reference-backend forward speed: the baseline every faster backend is measured against.

CPU:  tokens/s of prefill and decode on a tiny config (random weights, in memory).
GPU:  a DeepSeek-V4.1-Flash-shaped slice (full widths, 384 experts, one layer of each kind plus a
      DSpark block): time per layer kind for prefill and decode, and peak memory.

    python benchmarks/reference_forward.py --device cpu  [--config full --prefill 256 --decode 16]
    python benchmarks/reference_forward.py --device cuda [--layers 5 --prefill 2048 --decode 8]
                                           [--graphs on|off|both]

On CUDA, decode steps replay CUDA graphs (`--graphs on`, the runtime's default; reported with the GPU
time of back-to-back replays of each graph); `off` runs them eagerly, plus one more pass under a
synchronising per-layer timer for the layer tables; `both` measures eager first, then graphs, on the
same weights ("eager" in the JSON holds the former).

Weights are generated straight into memory in their storage formats (FP8 blocks, packed FP4 experts) by
`deepinfer.checkpoint.randomize.random_weights` (the engine's `--load-format dummy`), so the slice
occupies what it would in production.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from deepinfer.checkpoint.randomize import dummy_token_map, random_weights
from deepinfer.models.deepseek_v41.runtime import DeepseekV41Runtime, RuntimeOptions, build_runtime
from deepinfer.models.interface import ForwardBatch, SequenceSegment
from deepinfer.ops import BackendError, Ops, get_ops
from deepinfer.ops.reference import REFERENCE_OPS
from deepinfer.testing.configs import flash_slice_config, tiny_config

token_map = dummy_token_map  # the name the kernel tests (packages/deepinfer-kernels-cuda/tests) use


def _ops(backend: str | None, device: torch.device) -> Ops:
    try:
        return get_ops(backend, device)
    except BackendError:
        if backend not in (None, "reference"):
            raise
        # a source tree that is not pip-installed has no entry points: use the reference table directly
        return Ops("reference", REFERENCE_OPS, ())


class LayerTimer:
    """Wraps each block's attention and MoE to accumulate wall time per layer kind (synchronising)."""

    def __init__(self, runtime: DeepseekV41Runtime, device: torch.device) -> None:
        self.device = device
        self.ms: dict[str, float] = defaultdict(float)
        self.blocks = runtime.model.blocks
        self.originals = [(blk.attn, blk.moe) for blk in self.blocks]
        for blk in self.blocks:
            kind = f"{blk.spec.role} r{blk.spec.compress_ratio}" + (" +engram" if blk.engram else "")
            blk.attn = self._wrap(blk.attn, f"L{blk.spec.index} {kind}: attention")
            blk.moe = self._wrap(blk.moe, f"L{blk.spec.index} {kind}: MoE")

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _wrap(self, fn: Callable, label: str) -> Callable:
        def timed(*args: Any) -> Any:
            self._sync()
            t0 = time.perf_counter()
            out = fn(*args)
            self._sync()
            self.ms[label] += (time.perf_counter() - t0) * 1e3
            return out

        return timed

    def take(self) -> dict[str, float]:
        out, self.ms = dict(self.ms), defaultdict(float)
        return out

    def remove(self) -> None:
        for blk, (attn, moe) in zip(self.blocks, self.originals, strict=True):
            blk.attn, blk.moe = attn, moe


def run(
    runtime: DeepseekV41Runtime, device: torch.device, batch: int, prefill: int, decode: int, graphs: bool,
    layers: bool = True,
) -> dict:
    """Timed passes; `graphs`: decode through CUDA graphs, else eagerly (then also per layer if `layers`)."""
    block = runtime.cache_layout().block_size
    blocks = -(-(prefill + decode) // block)
    runtime.allocate_cache(batch * blocks + 1, batch + 1)
    if not graphs:
        runtime.graphs = None
    tables = {s: list(range(1 + (s - 1) * blocks, 1 + s * blocks)) for s in range(1, batch + 1)}
    gen = torch.Generator().manual_seed(0)
    prompts = {s: torch.randint(3, runtime.vocab_size, (prefill,), generator=gen).tolist() for s in tables}
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def one_pass(timer: LayerTimer | None = None) -> dict:
        """Prefill every prompt, decode greedily, one DSpark draft step: timed whole (and per layer)."""
        take = timer.take if timer else dict
        for s in tables:
            runtime.reset_slot(s)
        take()
        sync()
        t0 = time.perf_counter()
        out = runtime.forward(ForwardBatch([SequenceSegment(s, tables[s], 0, prompts[s]) for s in tables]))
        sync()
        prefill_s = time.perf_counter() - t0
        prefill_layers = take()
        nxt = {s: int(out.logits[i].argmax()) for i, s in enumerate(tables)}
        t0 = time.perf_counter()
        for step in range(decode):
            segs = [SequenceSegment(s, tables[s], prefill + step, [nxt[s]]) for s in tables]
            out = runtime.forward(ForwardBatch(segs))
            nxt = {s: int(out.logits[i].argmax()) for i, s in enumerate(tables)}
        sync()
        decode_s = time.perf_counter() - t0
        decode_layers = take()
        draft_ms = None
        if runtime.dspark is not None:  # one DSpark draft step for every sequence, after the decode steps
            sync()
            t0 = time.perf_counter()
            runtime.dspark.draft(runtime.cache, list(tables), [prefill + decode] * batch, list(nxt.values()))
            sync()
            draft_ms = (time.perf_counter() - t0) * 1e3
        return {
            "batch": batch,
            "prefill_tokens": prefill * batch,
            "prefill_s": prefill_s,
            "prefill_tok_s": prefill * batch / prefill_s,
            "decode_steps": decode,
            "decode_s": decode_s,
            "decode_tok_s": decode * batch / decode_s if decode else None,
            "prefill_layer_ms": prefill_layers,
            "prefill_other_ms": prefill_s * 1e3 - sum(prefill_layers.values()),  # embed, Engram, mHC, head
            "decode_layer_ms_per_step": {k: v / max(decode, 1) for k, v in decode_layers.items()},
            "decode_other_ms_per_step": (decode_s * 1e3 - sum(decode_layers.values())) / max(decode, 1),
            "dspark_draft_ms": draft_ms,
            "cuda_graphs": runtime.graphs is not None,
        }

    # A full rehearsal with the same shapes first: JIT backends compile every kernel variant the measured
    # pass needs (Triton specialises on sizes), and the allocator reaches its steady state.
    one_pass()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    result = one_pass()
    if device.type == "cuda":
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    if graphs:
        result["graph_replay_ms"] = replay_ms(runtime)
    elif layers:  # the layer timer synchronises around every sub-layer: its own pass
        timer = LayerTimer(runtime, device)
        timed = one_pass(timer)
        timer.remove()
        result.update({k: v for k, v in timed.items() if "layer_ms" in k or "other_ms" in k})
    return result


def replay_ms(runtime: DeepseekV41Runtime, reps: int = 20) -> dict[str, float]:
    """GPU time of one replay of each captured graph (back to back between CUDA events): the step
    without the host's metadata build and launch (replays rewrite the last step's cache rows)."""
    times = {}
    for shape, graph in runtime.graphs.graphs.items():
        graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        end.synchronize()
        key = f"{shape.num_seqs} x {shape.tokens}, table width {shape.table_width}"
        times[key] = start.elapsed_time(end) / reps
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--config", default="full", help="tiny config name (CPU run)")
    p.add_argument("--layers", type=int, default=5, help="backbone layers of the Flash slice (GPU run)")
    p.add_argument("--backend", default=None, help="op backend (default: best installed, else reference)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prefill", type=int, default=None)
    p.add_argument("--decode", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--cache-precision", choices=["release", "exact"], default=None,
                   help="KV cache storage (default: release on CUDA, as the engine; exact on CPU)")
    p.add_argument("--graphs", choices=["on", "off", "both"], default="on",
                   help="CUDA graphs for decode steps (CUDA only): on, off (per-layer times), both")
    p.add_argument("--no-layers", action="store_true", help="skip the per-layer pass of eager runs")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    if device.type == "cpu":
        config, what = tiny_config(args.config), f"tiny config {args.config!r}"
        prefill, decode = args.prefill or 256, args.decode if args.decode is not None else 16
    else:
        config, what = flash_slice_config(num_layers=args.layers), f"Flash slice, {args.layers} layers"
        prefill, decode = args.prefill or 2048, args.decode if args.decode is not None else 8
    precision = args.cache_precision or ("release" if device.type == "cuda" else "exact")
    t0 = time.perf_counter()
    tensors = random_weights(config, device)
    weight_gib = sum(t.numel() * t.element_size() for t in tensors.values()) / 2**30
    runtime = build_runtime(
        config,
        tensors,
        dtype=dtype,
        ops=_ops(args.backend, device),
        engram_token_map=dummy_token_map(config),
        options=RuntimeOptions(cache_precision=precision),
    )
    build_s = time.perf_counter() - t0
    result = {
        "what": what,
        "device": str(device),
        "dtype": args.dtype,
        "cache_precision": precision,
        "weights_gib": weight_gib,
        "build_s": build_s,
        "threads": torch.get_num_threads(),
    }
    graphs = args.graphs != "off" and device.type == "cuda"
    if args.graphs == "both" and graphs:
        result["eager"] = run(runtime, device, args.batch, prefill, decode, False, not args.no_layers)
    result.update(run(runtime, device, args.batch, prefill, decode, graphs, not args.no_layers))
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(device)
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
