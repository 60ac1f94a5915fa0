"""Device launches of one graphed decode step (or one eager prefill), per op family, without a GPU.

The `cuda` backend's op table on the CPU (TRITON_INTERPRET=1, set here before triton is imported, makes
every Triton kernel an interpreter object whose launches are intercepted) on a tiny model with the layer
kinds, window and index sizes of profile_step's 5-layer slice (SWA + Engram, Full C2, Full C1 candidate
source, Reindex, Reuse; DSpark block), release cache, one sequence decoding after --context tokens. A
recorder standing in for CUDA graphs re-runs the step: its replay is what a graph would hold, and is
what gets counted. A decode step reads nothing back to the host, so which ops it launches depends on no
value: Triton kernels are counted and not run (each zeroes its tensor arguments instead, uncounted, so
indices stay valid), torch ops run and count unless they would launch nothing on a GPU (views, shape
queries, allocations). Families as profile_step.py's OP_FAMILIES (an op's launches count for the
outermost table op around them, as profile_step's innermost range: the cuda ops call no table op); the
rest is "elementwise/copies/other". Seconds per count.

--prefill N counts one eager prefill of N tokens instead (its launches may depend on values: zeroed ones
here), and splits its host time per family into the Python around the launches (table op time minus the
time in aten ops and kernel stubs, which a GPU replaces by launch calls) and the model's Python between
table ops (metadata build apart): host work that no kernel time hides when it exceeds the GPU's.

    python benchmarks/launch_count.py [--dtype bfloat16 float32] [--invariant] [--kernels] [--context 2048]
                                      [--prefill 2048] [--json out.json]
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse
import functools
import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from profile_step import OP_FAMILIES, OTHER
from reference_forward import random_weights, token_map
from torch.utils._python_dispatch import TorchDispatchMode
from triton.runtime.interpreter import InterpretedFunction

from deepinfer.cache import BLOCK_TOKENS
from deepinfer.config import ModelConfig, engram_table_rows
from deepinfer.models.deepseek_v41.runtime import DeepseekV41Runtime, RuntimeOptions, build_runtime
from deepinfer.models.interface import ForwardBatch, SequenceSegment
from deepinfer.ops import Ops
from deepinfer.ops.reference.backend import ReferenceBackend
from deepinfer.testing.configs import flash_slice_config_dict, tiny_config_dict
from deepinfer_kernels_cuda.backend import CudaBackend

# aten ops that launch nothing on a GPU: views, metadata, allocations, host scalars
NO_LAUNCH = {
    "view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "expand", "permute", "transpose", "t",
    "slice", "select", "as_strided", "alias", "detach", "unbind", "split", "split_with_sizes", "chunk",
    "narrow", "unflatten", "flatten", "view_as", "expand_as", "empty", "empty_like", "empty_strided",
    "new_empty", "new_empty_strided", "lift_fresh", "sym_size", "sym_stride", "sym_numel", "dim", "size",
    "stride", "is_contiguous", "_reshape_alias", "diagonal", "movedim", "real", "imag", "view_as_real",
    "view_as_complex", "set_", "resize_",
}


class Counts:
    """Launches of the counted region per (family, kernel or aten op name)."""

    def __init__(self) -> None:
        self.on = False
        self.stack: list[str] = []
        self.in_triton = 0
        self.launches: Counter[tuple[str, str]] = Counter()
        self.launch_s = 0.0  # host seconds in counted aten ops and kernel stubs
        self.glue_s: Counter[str] = Counter()  # per family: table op seconds outside them

    def add(self, name: str) -> None:
        if self.on:
            self.launches[self.stack[0] if self.stack else OTHER, name] += 1

    def labelled(self, fn: Callable, label: str) -> Callable:
        @functools.wraps(fn)
        def ranged(*args: Any, **kwargs: Any) -> Any:
            outer = not self.stack
            t0, inner = time.perf_counter(), self.launch_s
            self.stack.append(label)
            try:
                return fn(*args, **kwargs)
            finally:
                self.stack.pop()
                if outer and self.on:
                    self.glue_s[label] += time.perf_counter() - t0 - (self.launch_s - inner)
        return ranged

    def families(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for (fam, _), n in self.launches.items():
            out[fam] += n
        return dict(out.most_common())


class AtenCounter(TorchDispatchMode):
    def __init__(self, counts: Counts) -> None:
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        if self.counts.in_triton:
            return func(*args, **(kwargs or {}))
        if name not in NO_LAUNCH:
            self.counts.add(f"aten::{name}")
        t0 = time.perf_counter()
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.counts.launch_s += time.perf_counter() - t0


def count_triton(counts: Counts) -> Callable[[], None]:
    """Counts every Triton launch into `counts` instead of running it (the launch zeroes its tensor
    arguments, uncounted) until the returned undo is called."""
    run = InterpretedFunction.run

    def counted(self: InterpretedFunction, *args: Any, **kwargs: Any) -> Any:
        counts.add(self.fn.__name__)
        counts.in_triton += 1
        t0 = time.perf_counter()
        try:
            for a in (*args, *kwargs.values()):
                if isinstance(a, torch.Tensor):
                    a.zero_()
            return None
        finally:
            counts.in_triton -= 1
            counts.launch_s += time.perf_counter() - t0

    InterpretedFunction.run = counted
    return lambda: setattr(InterpretedFunction, "run", run)


def slice_like_config() -> ModelConfig:
    """profile_step's 5-layer Flash slice schedule, window and index sizes at the tiny configs' widths."""
    slice_text = flash_slice_config_dict(num_layers=5)["text_config"]
    cfg = tiny_config_dict("full")
    t = cfg["text_config"]
    for key in ("num_hidden_layers", "compress_ratios", "kv_source_layer_ids", "index_source_layer_ids",
                "candidate_source_layer_id", "engram_layer_ids", "num_nextn_predict_layers",
                "dspark_target_layer_ids", "sliding_window", "index_topk", "candidate_topk_blocks",
                "candidate_block_size", "index_n_heads", "index_head_dim"):
        t[key] = slice_text[key]
    t["engram_num_embeddings"] = engram_table_rows(t["engram_layer_ids"], t["engram_max_ngram_size"],
                                                   t["engram_n_heads"], t["engram_vocab_size"])
    return ModelConfig.from_hf_dict(cfg)


def counted_runtime(counts: Counts, dtype: torch.dtype, invariant: bool) -> DeepseekV41Runtime:
    """The slice-like model on the CPU over the cuda table (reference ops where it has none), each table
    op and the LM head labelled with its family in `counts`."""
    config = slice_like_config()
    cuda, reference = CudaBackend(), ReferenceBackend()
    table = {**reference.ops(batch_invariant=invariant), **cuda.ops(batch_invariant=invariant)}
    table = {n: counts.labelled(fn, OP_FAMILIES.get(n, n)) for n, fn in table.items()}
    ops = Ops("cuda", table, (), cuda.plan, invariant)
    runtime = build_runtime(config, random_weights(config, torch.device("cpu")), dtype=dtype, ops=ops,
                            engram_token_map=token_map(config),
                            options=RuntimeOptions(cache_precision="release", batch_invariant=invariant))
    runtime.model.logits = counts.labelled(runtime.model.logits, "LM head")
    return runtime


def decode_step_launches(dtype: torch.dtype, invariant: bool, context: int) -> Counts:
    counts = Counts()
    runtime = counted_runtime(counts, dtype, invariant)

    def recorder(step: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, Callable[[], None]]:
        out = step()

        def replay() -> None:
            counts.on = True
            try:
                with AtenCounter(counts):
                    out.copy_(step())
            finally:
                counts.on = False
        return out, replay

    runtime.graph_recorder = recorder
    table_blocks = list(range(1, context // BLOCK_TOKENS + 2))
    runtime.allocate_cache(len(table_blocks) + 1, 2)
    undo = count_triton(counts)
    try:
        step = ForwardBatch([SequenceSegment(1, table_blocks, context, [5])])
        runtime.forward(step)  # captures (and replays once)
        counts.launches.clear()
        runtime.forward(step)  # replays
    finally:
        undo()
    return counts


def prefill_launches(dtype: torch.dtype, invariant: bool, tokens: int) -> tuple[Counts, dict[str, float]]:
    """Launches of one eager prefill of `tokens` tokens (after an uncounted one) and its host seconds:
    the whole forward, the metadata build, and the model's Python between table ops."""
    counts = Counts()
    runtime = counted_runtime(counts, dtype, invariant)
    table_blocks = list(range(1, tokens // BLOCK_TOKENS + 2))
    runtime.allocate_cache(len(table_blocks) + 1, 2)
    build, built = runtime.builder.build, [0.0, 0.0]  # seconds, of which in aten ops

    def timed_build(*args: Any, **kwargs: Any) -> Any:
        t0, inner = time.perf_counter(), counts.launch_s
        try:
            return build(*args, **kwargs)
        finally:
            built[0] += time.perf_counter() - t0
            built[1] += counts.launch_s - inner

    runtime.builder.build = timed_build
    step = ForwardBatch([SequenceSegment(1, table_blocks, 0, [3 + i % 97 for i in range(tokens)])])
    undo = count_triton(counts)
    try:
        with AtenCounter(counts):  # uncounted; the mode's first use imports a lot
            runtime.forward(step)
        runtime.reset_slot(1)
        counts.launches.clear()
        counts.launch_s, built[:] = 0.0, [0.0, 0.0]
        counts.on = True
        t0 = time.perf_counter()
        with AtenCounter(counts):
            runtime.forward(step)
        total = time.perf_counter() - t0
    finally:
        counts.on = False
        undo()
    glue, launch = sum(counts.glue_s.values()), counts.launch_s - built[1]
    return counts, {"forward": total, "metadata build": built[0], "table ops' Python": glue,
                    "aten ops and kernel stubs (CPU)": launch,
                    "model Python between table ops": total - built[0] - glue - launch}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"])
    p.add_argument("--invariant", action="store_true", help="also count the batch-invariant table")
    p.add_argument("--kernels", action="store_true", help="list every kernel / aten op per family")
    p.add_argument("--context", type=int, default=2048, help="tokens before the decoded one (profile_step's)")
    p.add_argument("--prefill", type=int, default=0, help="count one eager prefill of N tokens instead")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    results: dict[str, Any] = {}
    for dtype in args.dtype:
        for invariant in (False, True) if args.invariant else (False,):
            host: dict[str, float] = {}
            if args.prefill:
                counts, host = prefill_launches(getattr(torch, dtype), invariant, args.prefill)
                what = f"eager prefill of {args.prefill} tokens"
            else:
                counts = decode_step_launches(getattr(torch, dtype), invariant, args.context)
                what = f"decode b1 after {args.context} tokens"
            case = f"{dtype}{' invariant' if invariant else ''}"
            fams = counts.families()
            total = sum(fams.values())
            results[case] = {"total": total, "families": fams, "host_s": host,
                             "glue_s": dict(counts.glue_s.most_common()),
                             "kernels": {f"{f} | {k}": n for (f, k), n in sorted(counts.launches.items())}}
            print(f"\n### {what}, {case}: {total} launches/step")
            if host:
                print("  host ms: " + ", ".join(f"{k} {1e3 * v:.1f}" for k, v in host.items()))
            for f, n in fams.items():
                glue = f"  (Python {1e3 * counts.glue_s[f]:.2f} ms)" if host else ""
                print(f"  {f:28s} {n:4d}{glue}")
                if args.kernels:
                    for (ff, k), m in sorted(counts.launches.items()):
                        if ff == f:
                            print(f"      {k:40s} {m:3d}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
