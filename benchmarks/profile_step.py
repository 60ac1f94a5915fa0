"""Where the GPU time of a step goes: torch.profiler kernel breakdown of the Flash-width slice.

Same slice as decode_graphs.py (random weights, release cache, bf16, cuda backend, CUDA graphs), cases:
- decode1:  --steps replays of the graphed decode step, batch 1, 2048-token context;
- decode64: the same at batch 64, 512-token contexts;
- prefill:  one eager prefill of 2048 tokens (batch 1).
Each backend op (and the MoE's router / routed / shared parts, and the LM head) runs inside a
`record_function` range; an eager kernel takes the family of the range around its launch. Graph
replays launch no ops, so their kernels are aligned (by name sequence) with a profiled eager step of
the same shapes and take its families; if CUPTI recorded no kernel of the replays, the eager step's
kernels stand in (said in the output). Wall ms/step is timed without the profiler (synchronised steps).

    python benchmarks/profile_step.py [--layers 5 --steps 20 --cases decode1 prefill decode64
                                       --engram-vocab 10000 --json out.json] [--batch-invariant]
    python benchmarks/profile_step.py --cpu-check   # tiny config on the CPU: top-level aten ops as "kernels"
"""

from __future__ import annotations

import argparse
import functools
import json
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any

import torch
from decode_graphs import Bench, sync, timed_ms
from reference_forward import _ops
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from deepinfer.checkpoint.randomize import dummy_token_map, random_weights
from deepinfer.models.deepseek_v41.runtime import DeepseekV41Runtime, RuntimeOptions, build_runtime
from deepinfer.models.interface import ForwardBatch, SequenceSegment
from deepinfer.ops import Ops, get_ops
from deepinfer.testing.configs import flash_slice_config, tiny_config
from deepinfer.testing.recorder import rerun_recorder

OTHER = "elementwise/copies/other"
OP_FAMILIES = {  # backend op -> family (ops not listed keep their own name)
    "linear": "FP8 linear", "rms_norm": "norm", "rope_interleaved": "rope", "rms_norm_rope": "rope",
    "moe": "MoE combine/other",
    "hc_coefficients": "mHC coefficients", "hc_collapse": "mHC collapse", "hc_expand": "mHC expand",
    "hc_residual": "mHC coefficients+expand", "hc_collapse_norm": "mHC collapse+norm",
    "indexer_logits": "indexer logits", "indexer_topk": "indexer top-k", "cache_write": "cache write",
    "sparse_attention_sink": "attention", "sparse_attention_paged": "attention",
    "compressor_update": "compressor", "engram_hash": "Engram", "engram_lookup": "Engram",
    "engram_gate": "Engram", "sample_tokens": "sampling", "apply_penalties": "sampling",
    "apply_token_bitmask": "sampling",
}
MOE_PARTS = {"router_logits": "MoE router", "route": "MoE router", "routed_experts": "MoE routed",
             "_shared_expert": "MoE shared", "_shared_expert_invariant": "MoE shared",
             "_decode_fused": "MoE routed"}  # the fused decode path: its gate-up also runs the shared expert
CUBLAS = re.compile(r"gemm|gemv|nvjet|cutlass|xmma|cublas|splitk", re.IGNORECASE)
PREFIX = "prof:"
PARTS = {"gate_up": "gate-up", "down": "down"}  # routed-expert kernel name -> family suffix


def family(stack: list[str], kernel: str) -> str:
    """The family of a kernel launched inside the ranges `stack` (outermost first)."""
    if not stack:
        return OTHER
    if "LM head" in stack:
        return "LM head"
    inner = stack[-1]
    if inner == "FP8 linear":  # the Triton kernels first: cuBLAS names contain "gemv" too
        if "_gemv_fp8" in kernel or "_split_reduce" in kernel:
            return "FP8 linear GEMV"
        if "_block_linear" in kernel:
            return "FP8 linear tiled"
        return "cuBLAS gemm" if CUBLAS.search(kernel) else "FP8 linear other"
    if inner == "MoE routed":
        return next((f"MoE expert {v}" for k, v in PARTS.items() if k in kernel), "MoE routed other")
    return inner


def annotate(fn: Callable, label: str) -> Callable:
    @functools.wraps(fn)
    def ranged(*args: Any, **kwargs: Any) -> Any:
        with record_function(PREFIX + label):
            return fn(*args, **kwargs)
    return ranged


def annotated_ops(ops: Ops) -> Ops:
    """The same ops, each inside a range; the cuda MoE's parts get ranges of their own."""
    if ops.backend_name == "cuda":
        from deepinfer_kernels_cuda import moe
        for name, label in MOE_PARTS.items():
            if hasattr(moe, name):  # a part renamed away falls back to "MoE combine/other"
                setattr(moe, name, annotate(getattr(moe, name), label))
    table = {n: annotate(getattr(ops, n), OP_FAMILIES.get(n, n)) for n in ops.names}
    return Ops(ops.backend_name, table, ops.fallbacks, ops.plan, ops.batch_invariant)


@dataclass
class Kernel:
    name: str
    start: float  # us
    end: float
    family: str
    graph: int | None  # correlation id of the graph launch that ran it (None: launched eagerly)
    launch: float | None = None  # host start of the launch call (us, the profiler's clock)


def kernels(prof: profile, cuda: bool) -> list[Kernel]:
    """Device kernels (CPU run: top-level aten ops) with the family of the ranges around their launch."""
    events = list(prof.events())
    # the host side of our ranges; CUPTI also records each as a GPU user annotation (device CUDA,
    # GPU clock), which is no kernel and whose span would mislabel launches of other ops
    ranges = [(e.time_range.start, e.time_range.end, e.name[len(PREFIX):])
              for e in events if e.name.startswith(PREFIX) and e.device_type == DeviceType.CPU]
    ranges.sort()

    def fam(t: float, name: str) -> str:
        return family([label for s, e, label in ranges if s <= t <= e], name)

    if not cuda:
        def top(e: Any) -> bool:
            p = e.cpu_parent
            while p is not None and not p.name.startswith("aten::"):
                p = p.cpu_parent
            return e.name.startswith("aten::") and p is None
        return [Kernel(e.name, e.time_range.start, e.time_range.end, fam(e.time_range.start, e.name), None,
                       e.time_range.start) for e in events if e.device_type == DeviceType.CPU and top(e)]
    launches = {e.id: e for e in events if e.device_type == DeviceType.CPU and e.name.startswith("cu")}
    out = []
    for e in events:
        if e.device_type != DeviceType.CUDA or e.name.startswith(PREFIX):
            continue
        launch = launches.get(e.id)
        graph = launch.id if launch is not None and "GraphLaunch" in launch.name else None
        name_fam = fam(launch.time_range.start, e.name) if launch is not None and graph is None else OTHER
        out.append(Kernel(e.name, e.time_range.start, e.time_range.end, name_fam, graph,
                          None if launch is None else launch.time_range.start))
    return sorted(out, key=lambda k: k.start)


def align(graphed: list[Kernel], eager: list[Kernel]) -> None:
    """Give each replay's kernels the families of the eager step's kernels they match (name order)."""
    by_name: dict[str, Counter] = defaultdict(Counter)
    for k in eager:
        by_name[k.name][k.family] += 1
    replays: dict[int, list[Kernel]] = defaultdict(list)
    for k in graphed:
        if k.graph is not None:
            replays[k.graph].append(k)
    names = [k.name for k in eager]
    for replay in replays.values():
        for k in replay:
            k.family = by_name[k.name].most_common(1)[0][0] if k.name in by_name else OTHER
        matcher = SequenceMatcher(None, names, [k.name for k in replay], autojunk=False)
        for a, b, n in matcher.get_matching_blocks():
            for i in range(n):
                replay[b + i].family = eager[a + i].family


def busy_us(ks: Sequence[Any]) -> float:
    """Union of the intervals of `ks` (anything with .start and .end: kernels of streams that may overlap)."""
    total, end = 0.0, float("-inf")
    for k in sorted(ks, key=lambda k: k.start):
        if k.end > end:
            total += k.end - max(k.start, end)
            end = k.end
    return total


def summarise(ks: list[Kernel], steps: int, wall_ms: float) -> dict:
    fam_us, fam_n, name_us, name_n = Counter(), Counter(), Counter(), Counter()
    name_fam: dict[str, Counter] = defaultdict(Counter)
    for k in ks:
        fam_us[k.family] += k.end - k.start
        fam_n[k.family] += 1
        name_us[k.name] += k.end - k.start
        name_n[k.name] += 1
        name_fam[k.name][k.family] += 1
    total = sum(fam_us.values())
    return {
        "wall_us": wall_ms * 1e3, "kernel_us": total / steps, "busy_us": busy_us(ks) / steps,
        "launches": len(ks) / steps,
        "families": [{"family": f, "us": us / steps, "pct": 100 * us / max(total, 1e-9),
                      "launches": fam_n[f] / steps} for f, us in fam_us.most_common()],
        "top": [{"kernel": n, "family": name_fam[n].most_common(1)[0][0], "us": us / steps,
                 "launches": name_n[n] / steps} for n, us in name_us.most_common(15)],
    }


def table(case: str, r: dict) -> str:
    lines = [f"\n### {case}: {r['what']}\n", f"source: {r['source']}\n",
             f"wall {r['wall_us']:.0f} us/step, GPU busy {r['busy_us']:.0f} us "
             f"(idle {r['wall_us'] - r['busy_us']:.0f} us), kernel time {r['kernel_us']:.0f} us, "
             f"{r['launches']:.0f} launches/step\n",
             "| family | us/step | % | launches/step |", "|---|---:|---:|---:|"]
    lines += [f"| {f['family']} | {f['us']:.1f} | {f['pct']:.1f} | {f['launches']:.1f} |"
              for f in r["families"]]
    lines += ["", "| top kernel | family | us/step | launches/step |", "|---|---|---:|---:|"]
    lines += [f"| `{t['kernel'][:70]}` | {t['family']} | {t['us']:.1f} | {t['launches']:.1f} |"
              for t in r["top"]]
    return "\n".join(lines)


def profiled(fn: Callable[[], object], steps: int, cuda: bool) -> list[Kernel]:
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            fn()
            sync()
    return kernels(prof, cuda)


def decode_case(bench: Bench, steps: int, cuda: bool) -> tuple[list[Kernel], int, str, float]:
    """Kernels of the graphed decode step (count of profiled steps, where they come from, wall ms/step)."""
    step = bench.step([0] * bench.batch)
    bench.use_graphs(False)
    step()  # warm-up of the eager path
    eager = profiled(step, 1, cuda)
    bench.use_graphs(True)
    wall = timed_ms(step, steps)  # its warm-up captures the graph
    graphed = profiled(step, steps, cuda)
    in_graphs = sum(k.graph is not None for k in graphed) / steps
    graphs = bench.graphs[0]
    if cuda and graphs is not None and not graphs.failed and in_graphs < len(eager) / 2:  # CUPTI missed them
        note = f"CUPTI saw {in_graphs:.0f} graph kernels/replay"
        return eager, 1, f"one eager step of the same shapes ({note})", wall
    if not in_graphs:
        return graphed, steps, "eager steps (no graph replays)", wall
    align(graphed, eager)
    return graphed, steps, f"{steps} graph replays, families aligned with one profiled eager step", wall


def prefill_step(bench: Bench) -> Callable[[], torch.Tensor]:
    """One eager prefill of sequence 1's whole context (its cache slot reset first)."""
    gen = torch.Generator().manual_seed(1)
    seg = SequenceSegment(1, bench.tables[1], 0, torch.randint(3, bench.rt.vocab_size, (bench.prefill,),
                                                               generator=gen).tolist())

    def step() -> torch.Tensor:
        bench.rt.reset_slot(1)
        return bench.rt.forward(ForwardBatch([seg])).logits
    return step


def prefill_case(bench: Bench, cuda: bool) -> tuple[list[Kernel], int, str, float]:
    step = prefill_step(bench)
    wall = timed_ms(step, 2)
    return profiled(step, 1, cuda), 1, "one eager prefill", wall


def slice_runtime(cpu_check: bool, layers: int, engram_vocab: int,
                  batch_invariant: bool = False) -> tuple[DeepseekV41Runtime, dict[str, tuple[int, int]]]:
    """The profiled runtime (its ops and LM head in ranges) and each case's (batch, context): the Flash
    slice on the GPU, or with `cpu_check` the tiny config on the CPU."""
    if cpu_check:
        device, dtype, config, precision = torch.device("cpu"), torch.float32, tiny_config("full"), "exact"
        shapes = {"decode1": (1, 20), "decode64": (3, 9), "prefill": (1, 20)}
    else:
        device, dtype, precision = torch.device("cuda"), torch.bfloat16, "release"
        config = flash_slice_config(num_layers=layers, engram_vocab_size=engram_vocab)
        shapes = {"decode1": (1, 2048), "decode64": (64, 512), "prefill": (1, 2048)}
    backend = "cuda" if device.type == "cuda" else None
    base = get_ops(backend, device, batch_invariant=True) if batch_invariant else _ops(backend, device)
    runtime = build_runtime(config, random_weights(config, device), dtype=dtype, ops=annotated_ops(base),
                            engram_token_map=dummy_token_map(config),
                            options=RuntimeOptions(cache_precision=precision,
                                                   batch_invariant=batch_invariant))
    runtime.model.logits = annotate(runtime.model.logits, "LM head")
    if cpu_check:
        runtime.graph_recorder = rerun_recorder
    return runtime, shapes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--cases", nargs="+", choices=["decode1", "decode64", "prefill"],
                   default=["decode1", "prefill", "decode64"])  # the first two share one cache
    p.add_argument("--engram-vocab", type=int, default=10_000,
                   help="Engram vocabulary of the slice (100k, decode_graphs' default, draws ~20 s longer)")
    p.add_argument("--json", default=None)
    p.add_argument("--batch-invariant", action="store_true",
                   help="profile the batch-invariant op tables and runtime (where its cost goes)")
    p.add_argument("--cpu-check", action="store_true", help="dry run of every code path on the CPU")
    args = p.parse_args()
    if args.cpu_check:
        args.steps = 2
    runtime, shapes = slice_runtime(args.cpu_check, args.layers, args.engram_vocab, args.batch_invariant)
    cuda = runtime.device.type == "cuda"
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(runtime.device) if cuda else "cpu",
                               "batch_invariant": args.batch_invariant, "layers": args.layers,
                               "engram_vocab": args.engram_vocab, "steps": args.steps}
    benches: dict[tuple[int, int], Bench] = {}
    for case in args.cases:
        batch, ctx = shapes[case]
        if (batch, ctx) not in benches:
            benches.clear()  # the cache of one shape at a time
            benches[batch, ctx] = Bench(runtime, batch, ctx, 0)  # its prefill warms the prefill path
        bench = benches[batch, ctx]
        if case == "prefill":
            ks, steps, source, wall = prefill_case(bench, cuda)
            what = f"eager prefill of {ctx} tokens, batch 1 ({ctx / wall * 1e3:.0f} tok/s)"
        else:
            ks, steps, source, wall = decode_case(bench, args.steps, cuda)
            what = f"decode, batch {batch}, {ctx}-token contexts"
        results[case] = {"what": what, "source": source, **summarise(ks, steps, wall)}
        print(table(case, results[case]), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
