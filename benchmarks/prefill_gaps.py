"""Where an eager prefill step's GPU idles: host time, device waits, and the gaps between kernels.

profile_step's slice and runtime (ops in ranges), one eager prefill of its 2048-token prompt:
- without the profiler (--repeat steps): the host's time to enqueue the step (until forward returns)
  against its synchronised wall time and GPU span (CUDA events), host ms per part (metadata build,
  each layer's attention and MoE sub-layer, LM head) and Python's garbage collections: when enqueueing
  takes as long as the wall, the host is the bound;
- device waits: torch.cuda.set_sync_debug_mode("warn") over one step, each warning with its stack;
- under torch.profiler: GPU busy and idle in the step (idle before the first kernel, then each gap
  split into host-late, where the next kernel's launch call began after the GPU ran dry, and the
  rest), the largest gaps with the kernel after each, its family, the part it was launched from and
  the CUDA runtime calls the host made during the gap; runtime calls (count, host us) by name; host
  us per op family (its ranges' time, profiler overhead included).

    python benchmarks/prefill_gaps.py [--layers 5 --engram-vocab 10000 --repeat 5 --top 15 --json out.json]
    python benchmarks/prefill_gaps.py --cpu-check   # tiny config on the CPU (aten ops stand in as kernels)
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import time
import traceback
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import torch
from decode_graphs import Bench, sync
from profile_step import PREFIX, Kernel, busy_us, kernels, prefill_step, slice_runtime
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from deepinfer.models.deepseek_v41.runtime import DeepseekV41Runtime

PART = "part:"  # host ranges of the step's parts (not op families: profile_step.kernels ignores them)
STEP = "whole step"


class Parts:
    """Host seconds per part of the step (perf_counter), each part also a profiler range."""

    def __init__(self) -> None:
        self.seconds: Counter[str] = Counter()

    def wrap(self, fn: Callable, label: str) -> Callable:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            with record_function(PART + label):
                out = fn(*args, **kwargs)
            self.seconds[label] += time.perf_counter() - t0
            return out
        return timed


def instrument(rt: DeepseekV41Runtime, step: Callable[[], torch.Tensor], parts: Parts) -> Callable[[], Any]:
    """The step with its parts timed: metadata build, each block's attention and MoE sub-layer, LM head."""
    rt.builder.build = parts.wrap(rt.builder.build, "metadata build")
    for i, blk in enumerate(rt.model.blocks):
        blk.attn = parts.wrap(blk.attn, f"L{i} attention")
        blk.ffn = parts.wrap(blk.ffn, f"L{i} MoE")
    rt.model.logits = parts.wrap(rt.model.logits, "LM head")
    return parts.wrap(step, STEP)


class Collections:
    """Python garbage collections (count, seconds) while active: a host stall no profiler range names."""

    def __init__(self) -> None:
        self.count, self.seconds, self.active, self._t0 = 0, 0.0, False, 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if not self.active:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.count += 1
            self.seconds += time.perf_counter() - self._t0


def timing(step: Callable[[], Any], parts: Parts, repeat: int, cuda: bool) -> dict[str, Any]:
    """Mean host enqueue ms, wall ms and GPU span ms per step, host ms per part, and the garbage
    collections during the steps."""
    step()
    sync()
    parts.seconds.clear()
    host = wall = span = 0.0
    collections = Collections()
    gc.callbacks.append(collections)
    collections.active = True
    for _ in range(repeat):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        step()
        host += time.perf_counter() - t0
        if cuda:
            end.record()
        sync()
        wall += time.perf_counter() - t0
        if cuda:
            span += start.elapsed_time(end) / 1e3
    gc.callbacks.remove(collections)
    ms = {name: 1e3 * s / repeat for name, s in parts.seconds.items()}
    return {"host_ms": 1e3 * host / repeat, "wall_ms": 1e3 * wall / repeat,
            "gpu_span_ms": 1e3 * span / repeat if cuda else None, "parts_ms": ms,
            "gc_per_step": collections.count / repeat, "gc_ms_per_step": 1e3 * collections.seconds / repeat}


def device_waits(step: Callable[[], Any]) -> list[dict[str, Any]]:
    """The synchronising CUDA calls of one step (torch's sync debug mode), each with its stack."""
    found: list[dict[str, Any]] = []
    show = warnings.showwarning

    def record(message: Any, category: Any, filename: str, lineno: int, *rest: Any) -> None:
        if "prototype feature" in str(message):  # set_sync_debug_mode's own notice
            return
        found.append({"message": str(message)[:200],
                      "stack": [f"{f.filename.rsplit('/', 3)[-1]}:{f.lineno} {f.name}"
                                for f in traceback.extract_stack()[-12:-2]]})

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
            warnings.showwarning = show
    sync()
    return found


def ranges_of(events: list[Any], prefix: str) -> list[tuple[float, float, str]]:
    return sorted((e.time_range.start, e.time_range.end, e.name[len(prefix):])
                  for e in events if e.name.startswith(prefix) and e.device_type == DeviceType.CPU)


def inner(ranges: list[tuple[float, float, str]], t: float) -> str:
    """The innermost range around host time t ('-' if none)."""
    around = [(s, label) for s, e, label in ranges if s <= t <= e]
    return max(around)[1] if around else "-"


def gaps(ks: list[Kernel], events: list[Any], top: int) -> dict[str, Any]:
    """GPU idle of the step: before its first kernel, and between kernels (host-late or not)."""
    step = next(r for r in ranges_of(events, PART) if r[2] == STEP)
    ks = sorted((k for k in ks if k.start >= step[0]), key=lambda k: k.start)
    parts, ops = ranges_of(events, PART), ranges_of(events, PREFIX)
    calls = [e for e in events if e.device_type == DeviceType.CPU and e.name.startswith("cu")
             and step[0] <= e.time_range.start <= step[1]]
    rows, end, late, other = [], ks[0].start if ks else step[0], 0.0, 0.0
    for k in ks:
        gap = k.start - end
        if gap > 0:
            host_late = 0.0 if k.launch is None else min(gap, max(0.0, k.launch - end))
            late, other = late + host_late, other + gap - host_late
            during = sorted(((c.time_range.end - c.time_range.start, c.name) for c in calls
                             if c.time_range.start < k.start and c.time_range.end > end), reverse=True)
            rows.append({"gap_us": gap, "host_late_us": host_late, "kernel": k.name[:60], "family": k.family,
                         "part": inner(parts, k.launch if k.launch is not None else k.start),
                         "op": inner(ops, k.launch if k.launch is not None else k.start),
                         "calls": [f"{n} {d:.0f}us" for d, n in during[:3]]})
        end = max(end, k.end)
    by_call: dict[str, list[float]] = defaultdict(list)
    for c in calls:
        by_call[c.name].append(c.time_range.end - c.time_range.start)
    host_ops: Counter[str] = Counter()
    for s, e, label in ops:  # outermost op ranges only (an op's ranges nest inside it)
        if not any(s2 < s and e <= e2 for s2, e2, _ in ops):
            host_ops[label] += e - s
    first = ks[0].start - step[0] if ks else 0.0
    return {
        "step_us": step[1] - step[0], "span_us": max(k.end for k in ks) - step[0] if ks else 0.0,
        "busy_us": busy_us(ks), "kernels": len(ks),
        "idle_before_first_us": first,
        "idle_between_us": late + other, "host_late_us": late, "other_idle_us": other,
        "part_before_first": inner(parts, ks[0].launch) if ks and ks[0].launch is not None else "-",
        # the first kernels: (name, host us from the step's start to its launch call, to its GPU start)
        "first_kernels": [(k.name[:50], None if k.launch is None else k.launch - step[0], k.start - step[0])
                          for k in ks[:5]],
        "largest_gaps": sorted(rows, key=lambda r: -r["gap_us"])[:top],
        "gap_us_by_part": dict(Counter({p: sum(r["gap_us"] for r in rows if r["part"] == p)
                                        for p in {r["part"] for r in rows}}).most_common()),
        "runtime_calls": {n: {"count": len(d), "us": sum(d), "max_us": max(d)}
                          for n, d in sorted(by_call.items(), key=lambda kv: -sum(kv[1]))},
        "host_us_by_op": dict(host_ops.most_common()),
    }


def report(r: dict[str, Any]) -> str:
    t, g = r["timing"], r["gaps"]
    span = f"{t['gpu_span_ms']:.2f}" if t["gpu_span_ms"] is not None else "-"
    rate = 1e3 * r["tokens"] / t["wall_ms"]
    lines = [f"\n### eager prefill of {r['tokens']} tokens: host enqueue {t['host_ms']:.2f} ms, wall "
             f"{t['wall_ms']:.2f} ms, GPU span {span} ms ({rate:.0f} tok/s wall)\n",
             "host ms per part (no profiler): " + ", ".join(f"{k} {v:.2f}" for k, v in t["parts_ms"].items()),
             f"garbage collections per step: {t['gc_per_step']:.1f} ({t['gc_ms_per_step']:.2f} ms)",
             f"\nsynchronising calls in one step: {len(r['device_waits'])}"]
    lines += [f"- {w['message']}\n    " + "\n    ".join(w["stack"][-6:]) for w in r["device_waits"]]
    lines += [f"\nprofiled step: host {g['step_us']:.0f} us, step start to last kernel end "
              f"{g['span_us']:.0f} us, GPU busy {g['busy_us']:.0f} us in {g['kernels']} kernels, idle before "
              f"the first kernel {g['idle_before_first_us']:.0f} us (host in "
              f"{g['part_before_first']}), idle between kernels {g['idle_between_us']:.0f} us (host-late "
              f"{g['host_late_us']:.0f}, other {g['other_idle_us']:.0f})",
              "first kernels (name, launch call us / GPU start us after the step's start): "
              + "; ".join(f"{n} {'-' if at is None else f'{at:.0f}'} / {gpu:.0f}"
                          for n, at, gpu in g["first_kernels"]),
              "gap us by the part that launched the next kernel: "
              + ", ".join(f"{k} {v:.0f}" for k, v in g["gap_us_by_part"].items()),
              "", "| gap us | host-late us | next kernel | family | part | op | runtime calls in the gap |",
              "|---:|---:|---|---|---|---|---|"]
    lines += [f"| {x['gap_us']:.0f} | {x['host_late_us']:.0f} | `{x['kernel']}` | {x['family']} | "
              f"{x['part']} | {x['op']} | {'; '.join(x['calls'])} |" for x in g["largest_gaps"]]
    lines += ["", "| runtime call | count | host us | max us |", "|---|---:|---:|---:|"]
    lines += [f"| {n} | {c['count']} | {c['us']:.0f} | {c['max_us']:.0f} |"
              for n, c in g["runtime_calls"].items()]
    lines += ["", "host us per op family (profiled): "
              + ", ".join(f"{k} {v:.0f}" for k, v in g["host_us_by_op"].items())]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=5)
    p.add_argument("--engram-vocab", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=5, help="timed steps without the profiler")
    p.add_argument("--top", type=int, default=15, help="largest gaps listed")
    p.add_argument("--json", default=None)
    p.add_argument("--cpu-check", action="store_true", help="dry run of every code path on the CPU")
    args = p.parse_args()
    runtime, shapes = slice_runtime(args.cpu_check, args.layers, args.engram_vocab)
    cuda = runtime.device.type == "cuda"
    tokens = shapes["prefill"][1]
    bench = Bench(runtime, 1, tokens, 0)  # its prefill warms the prefill path
    parts = Parts()
    step = instrument(runtime, prefill_step(bench), parts)
    result: dict[str, Any] = {"tokens": tokens, "timing": timing(step, parts, args.repeat, cuda),
                              "device_waits": device_waits(step) if cuda else []}
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        step()
        sync()
    # CUPTI also records each part's range as a GPU user annotation (no kernel): spanning the whole step,
    # the "whole step" one covered every gap (idle between kernels read ~0 and busy the step's span)
    ks = [k for k in kernels(prof, cuda) if not k.name.startswith(PART)]
    result["gaps"] = gaps(ks, list(prof.events()), args.top)
    print(report(result), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
