"""Which ops make a sequence's decode logits depend on the rest of the batch (issue 10 item 7's survey).

On the Flash-width slice (cuda backend, bf16, release cache): a probe sequence is prefilled alone (so its
cache is the same in every run), other sequences likewise, then one decode step runs with the probe as
row 0 of batches of each `--batch` size, eagerly and through CUDA graphs. Every op call of the decode
step is recorded; an op is batch-variant where its row-0 inputs are bitwise those of the batch-1 run and
its row-0 output is not. Prints, per batch size and mode, whether the probe's logits are bitwise those of
batch 1, and the ops that changed row 0 first.

    python benchmarks/batch_invariance.py [--layers 3 --batch 1 3 8 64 --json out.json]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from reference_forward import _ops, random_weights, token_map

from deepinfer.models.deepseek_v41.runtime import DeepseekV41Runtime, RuntimeOptions, build_runtime
from deepinfer.models.interface import ForwardBatch, SequenceSegment
from deepinfer.ops import Ops
from deepinfer.testing.configs import flash_slice_config

PREFILL = 300  # crosses a block boundary and fills the window


class Recorder:
    """Row 0 of every tensor argument and result with `rows` rows, per op call, while `on`."""

    def __init__(self) -> None:
        self.on, self.rows = False, 0
        self.calls: list[tuple[str, list[torch.Tensor], list[torch.Tensor]]] = []

    def wrap(self, name: str, fn: Callable) -> Callable:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            if self.on:
                ins = [*args, *kwargs.values()]
                outs = list(out) if isinstance(out, tuple) else [out]
                self.calls.append((name, self._row0(ins), self._row0(outs)))
            return out

        return recorded

    def _row0(self, values: list[Any]) -> list[torch.Tensor]:
        rows = self.rows
        return [v[0].clone() for v in values if isinstance(v, torch.Tensor) and v.dim() and len(v) == rows]


def decode_probe(runtime: DeepseekV41Runtime, rec: Recorder, batch: int, graphs: bool) -> torch.Tensor:
    """Probe logits of one decode step in a batch of `batch` (calls recorded when eager)."""
    blocks = -(-(PREFILL + 1) // runtime.cache_layout().block_size)
    runtime.allocate_cache(batch * blocks + 1, batch + 1)
    if not graphs:
        runtime.graphs = None
    tables = {s: list(range(1 + (s - 1) * blocks, 1 + s * blocks)) for s in range(1, batch + 1)}
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, runtime.vocab_size, (PREFILL,), generator=gen).tolist() for _ in tables]
    for s, prompt in zip(tables, prompts, strict=True):  # alone: the probe's cache is the same every run
        runtime.forward(ForwardBatch([SequenceSegment(s, tables[s], 0, prompt)]))
    segs = [SequenceSegment(s, tables[s], PREFILL, [7 + s]) for s in tables]
    if graphs:  # the first step of a shape captures; decode once more at the same position to replay
        runtime.forward(ForwardBatch(segs))
    rec.on, rec.rows, rec.calls = not graphs, batch, []
    logits = runtime.forward(ForwardBatch(segs)).logits[0].clone()
    rec.on = False
    return logits


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 3, 8, 64])
    p.add_argument("--json", default=None)
    args = p.parse_args()
    device = torch.device("cuda")
    config = flash_slice_config(num_layers=args.layers)
    rec = Recorder()
    ops = _ops("cuda", device)
    table = {n: rec.wrap(n, getattr(ops, n)) for n in ops.names}
    runtime = build_runtime(config, random_weights(config, device), dtype=torch.bfloat16,
                            ops=Ops(ops.backend_name, table, ops.fallbacks, ops.plan),
                            engram_token_map=token_map(config),
                            options=RuntimeOptions(cache_precision="release"))
    report: dict = {}
    for graphs in (False, True):
        mode = "graphs" if graphs else "eager"
        base = decode_probe(runtime, rec, 1, graphs)
        base_calls = rec.calls
        for batch in args.batch[1:] if args.batch[0] == 1 else args.batch:
            logits = decode_probe(runtime, rec, batch, graphs)
            entry: dict = {"bitwise": bool(torch.equal(logits, base)),
                           "max_abs_diff": float((logits - base).abs().max())}
            if not graphs:
                variant: Counter[str] = Counter()
                entry["op_calls"] = (len(rec.calls), len(base_calls))
                for (name, ins, outs), (_, ins1, outs1) in zip(rec.calls, base_calls, strict=False):
                    same_in = len(ins) == len(ins1) and all(torch.equal(a, b) for a, b in zip(ins, ins1))
                    if same_in and not all(torch.equal(a, b) for a, b in zip(outs, outs1)):
                        variant[name] += 1
                entry["variant_ops"] = dict(variant)
            report[f"{mode} batch {batch}"] = entry
            print(f"{mode} batch {batch}: {entry}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
