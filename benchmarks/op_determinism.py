"""Which op gives different outputs for identical inputs across two runs of the same step (a race, or a
read of memory the op never wrote), op by op on a model slice.

The step (a prefill of `--batch` sequences of `--context` random tokens, fresh slots) runs twice on one
runtime; before the second run the freed device memory is filled with NaN, so an op that reads rows it
never wrote shows NaN there. Every op call (and, on the cuda backend, the MoE's router, routed experts
and shared expert) records its tensor inputs and outputs; the report names each call whose outputs
differ while its inputs are identical (the culprit; later calls then differ through their inputs). Expert
ids out of range (NaN router logits make the cuda top-k pick id E) are set to 0, noted, so that the run
reaches its end instead of a device assert.

Written for batch_invariance.py --cost's device assert (session 6: a 512-token prefill of the 2-layer,
64-expert slice had garbage token rows after layer 0's MoE, different in every run).

    python benchmarks/op_determinism.py [--layers 2 --experts 64 --context 512 --batch 1]
    python benchmarks/op_determinism.py --device cpu --backend reference --config full --context 24
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch

from deepinfer.checkpoint.randomize import dummy_token_map, random_weights
from deepinfer.models.deepseek_v41.runtime import RuntimeOptions, build_runtime
from deepinfer.models.interface import ForwardBatch, SequenceSegment
from deepinfer.ops import Ops, get_ops
from deepinfer.testing.configs import flash_slice_config, tiny_config

Call = tuple[str, list[torch.Tensor], list[torch.Tensor]]  # name, inputs, outputs (copies)
MOE_PARTS = ("router_logits", "routed_experts", "_shared_expert")


def _tensors(v: Any) -> list[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (tuple, list)):
        return [t for x in v for t in _tensors(x)]
    return []


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, NaN equal to NaN."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return torch.equal(a, b)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Recorder:
    """Per run, the inputs and outputs of every wrapped call."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.runs, self.notes = device, [[], []], []
        self.run = 0

    def wrap(self, name: str, fn: Callable) -> Callable:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            ins = [t.clone() for t in _tensors([*args, *kwargs.values()])]
            out = fn(*args, **kwargs)
            _sync(self.device)
            self.runs[self.run].append((name, ins, [t.clone() for t in _tensors(out)]))
            return out

        return recorded

    def guarded_route(self, route: Callable) -> Callable:
        def guarded(logits: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            weights, ids = route(logits, *args, **kwargs)
            bad = (ids < 0) | (ids >= logits.shape[1])
            if bad.any():
                nonfinite = int((~logits.isfinite()).any(1).sum())
                self.notes.append(f"run {self.run + 1}: {int(bad.any(1).sum())} tokens with expert ids "
                                  f"out of range (non-finite router logits: {nonfinite} rows)")
                ids = torch.where(bad, torch.zeros_like(ids), ids)
            return weights, ids

        return guarded


def recorded_ops(ops: Ops, rec: Recorder) -> Ops:
    """`ops` with every op recorded (weight preparation aside); the cuda MoE's parts recorded too."""
    if ops.backend_name == "cuda":
        from deepinfer_kernels_cuda import moe
        for name in MOE_PARTS:
            setattr(moe, name, rec.wrap(f"moe.{name}", getattr(moe, name)))
        moe.route = rec.wrap("moe.route", rec.guarded_route(moe.route))
    table = {n: getattr(ops, n) if n.startswith("prepare") else rec.wrap(n, getattr(ops, n))
             for n in ops.names}
    return Ops(ops.backend_name, table, ops.fallbacks, ops.plan, ops.batch_invariant)


def fill_free_memory_with_nan(device: torch.device) -> None:
    """Large and small cached blocks of NaN, freed again: later allocations reuse them."""
    if device.type != "cuda":
        return
    big = torch.full((torch.cuda.mem_get_info(device)[0] // 2 // 4,), float("nan"), device=device)
    small = [torch.full((1 << 17,), float("nan"), device=device) for _ in range(2000)]
    del big, small


def differing(runs: list[list[Call]]) -> list[dict]:
    """Calls whose outputs differ between the runs: per call its inputs' equality and the differing rows."""
    found = []
    for i, ((name, in0, out0), (name1, in1, out1)) in enumerate(zip(*runs)):
        if name != name1:
            found.append({"call": i, "op": name, "error": f"the second run called {name1} here"})
            break
        if len(out0) == len(out1) and all(_same(a, b) for a, b in zip(out0, out1, strict=True)):
            continue
        outs = []
        for a, b in zip(out0, out1, strict=True):
            if _same(a, b):
                continue
            d = (a != b) & ~(a.isnan() & b.isnan()) if a.is_floating_point() else a != b
            rows = d.reshape(d.shape[0], -1).any(1).nonzero().flatten().tolist() if d.dim() else [0]
            outs.append({"shape": list(a.shape), "rows": len(rows), "first_rows": rows[:12],
                         "nan_in_second": bool(b.isnan().any()) if b.is_floating_point() else False})
        same_inputs = len(in0) == len(in1) and all(_same(a, b) for a, b in zip(in0, in1, strict=True))
        found.append({"call": i, "op": name, "inputs_identical": same_inputs, "outputs": outs,
                      "after": [c[0] for c in runs[0][max(0, i - 3):i]]})
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--experts", type=int, default=64, help="routed experts of the slice")
    p.add_argument("--engram-vocab", type=int, default=10_000)
    p.add_argument("--context", type=int, default=512, help="prefill tokens per sequence")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--device", default="cuda")
    p.add_argument("--backend", default="cuda")
    p.add_argument("--config", default="flash-slice", help="flash-slice or a tiny config name")
    p.add_argument("--show", type=int, default=8, help="differing calls printed")
    args = p.parse_args()
    device = torch.device(args.device)
    if args.config == "flash-slice":
        config = flash_slice_config(num_layers=args.layers, n_routed_experts=args.experts,
                                    dspark_n_routed_experts=min(args.experts, 16),
                                    engram_vocab_size=args.engram_vocab)
        dtype = torch.bfloat16
    else:
        config, dtype = tiny_config(args.config), torch.float32
    rec = Recorder(device)
    ops = recorded_ops(get_ops(args.backend, device), rec)
    runtime = build_runtime(config, random_weights(config, device), dtype=dtype, ops=ops,
                            engram_token_map=dummy_token_map(config),
                            options=RuntimeOptions(cache_precision="release"))
    per_seq = -(-(args.context + 1) // runtime.cache_layout().block_size)
    runtime.allocate_cache(1 + args.batch * per_seq, args.batch + 1)
    gen = torch.Generator().manual_seed(0)
    segs = [SequenceSegment(s, list(range(1 + (s - 1) * per_seq, 1 + s * per_seq)), 0,
                            torch.randint(3, runtime.vocab_size, (args.context,), generator=gen).tolist())
            for s in range(1, args.batch + 1)]
    for run in (0, 1):
        rec.run = run
        if run:
            fill_free_memory_with_nan(device)
        for seg in segs:
            runtime.reset_slot(seg.slot)
        logits = runtime.forward(ForwardBatch(segs)).logits
        _sync(device)
        print(f"run {run + 1}: {len(rec.runs[run])} calls, logits finite: {bool(logits.isfinite().all())}",
              flush=True)
    print(*rec.notes, sep="\n")
    found = differing(rec.runs)
    culprits = [f for f in found if f.get("inputs_identical")]
    print(f"{len(found)} of {len(rec.runs[1])} calls differ between the runs; with identical inputs: "
          f"{[(f['call'], f['op']) for f in culprits]}")
    for f in found[: args.show]:
        print(f)


if __name__ == "__main__":
    main()
