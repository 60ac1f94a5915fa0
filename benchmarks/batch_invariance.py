"""Which ops make a sequence's decode logits depend on the rest of the batch (issue 10 item 7's survey).

On the Flash-width slice (cuda backend, bf16, release cache): a probe sequence is prefilled alone (so its
cache is the same in every run), other sequences likewise, then one decode step runs with the probe as
row 0 of batches of each `--batch` size, eagerly and through CUDA graphs; "mixed" puts the probe's decode
row in one step with a companion's whole prefill (many rows: the large-M kernel configs).

Eagerly, the step is "pinned" to the batch-1 run: every op call gets row 0 of its row inputs replaced by
the batch-1 call's, and its row-0 output is compared with the batch-1 one and then replaced by it. So
each op is judged on its own (no cascade from an earlier op): `variant_ops` counts the calls whose row-0
output changed. A row-0 input that differs from batch 1 although every earlier output was pinned comes
from model code between ops (`non_op_before` names the op that read it). Prints, per batch and mode,
whether the probe's logits are bitwise those of batch 1 (unpinned, eager and graphs).

`--modes default invariant`: the backend's default ops, then its batch-invariant ones (get_ops(...,
batch_invariant=True)).

`--cost`: what the invariant mode costs instead, per mode: decode ms/step at each `--batch` size (CUDA
graphs, after a batched prefill of `--context` tokens per sequence) and prefill tok/s of one
`--prefill`-token sequence; then the invariant / default ratios. Both modes' runtimes are built on the
same weights and timed in turn, `--rounds` times (medians), so neither pays alone for drift in clocks,
allocator or host load (timed one after the other, the second mode ran up to ~0.5 ms/step slower at
batch 1 than its GPU time explains). `probe_bitwise`: whether slot 1 (the
same prompt in every batch, prefilled and decoded beside the others) gets the first batch size's
logits bitwise; `probe_finite`: whether they are finite (not so on the 64-expert slice in session 6:
garbage token rows after layer 0's MoE; benchmarks/op_determinism.py names the op).

    python benchmarks/batch_invariance.py [--layers 3 --batch 3 8 64 mixed --json out.json]
    python benchmarks/batch_invariance.py --cost [--layers 2 --batch 1 8 64 --json cost.json]
    python benchmarks/batch_invariance.py --device cpu --backend reference --config full --modes default
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import torch

from deepinfer.checkpoint.randomize import dummy_token_map, random_weights
from deepinfer.models.deepseek_v41.runtime import DeepseekV41Runtime, RuntimeOptions, build_runtime
from deepinfer.models.interface import ForwardBatch, SequenceSegment
from deepinfer.ops import BackendError, Ops, available_backends, get_ops
from deepinfer.ops.registry import invariant_ops
from deepinfer.testing.configs import flash_slice_config, tiny_config

PREFILL = 300  # crosses a block boundary and fills the window

Call = tuple[str, dict[Any, torch.Tensor], list[torch.Tensor | None]]  # name, row-0 inputs, row-0 outputs


def _is_rows(v: Any, rows: int) -> bool:
    return isinstance(v, torch.Tensor) and v.dim() > 0 and len(v) == rows


def _differs(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Both recorded, comparable (a padded capacity may change shapes) and not bitwise equal."""
    return a is not None and b is not None and a.shape == b.shape and not torch.equal(a, b)


class Recorder:
    """Records row 0 of every row tensor (first dim = the step's rows) per op call while `on`; with
    `pin` (the batch-1 calls), pins row 0 of inputs and outputs to them as the module docstring says."""

    def __init__(self) -> None:
        self.on, self.rows = False, 0
        self.pin: list[Call] | None = None
        self.calls: list[Call] = []
        self.variant: Counter[str] = Counter()
        self.non_op: Counter[str] = Counter()

    def wrap(self, name: str, fn: Callable) -> Callable:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return fn(*args, **kwargs)
            i = len(self.calls)
            ref = self.pin[i] if self.pin is not None and i < len(self.pin) else None
            if ref is not None and ref[0] != name:
                raise RuntimeError(f"op call {i}: {name} where the batch-1 step called {ref[0]}")
            ins = self._row0(dict(enumerate(args)) | kwargs)
            if ref is not None:
                if any(_differs(v, ref[1].get(k)) for k, v in ins.items()):
                    self.non_op[name] += 1
                args = tuple(self._patch(a, ref[1].get(j)) for j, a in enumerate(args))
                kwargs = {k: self._patch(a, ref[1].get(k)) for k, a in kwargs.items()}
            out = fn(*args, **kwargs)
            outs = list(out) if isinstance(out, tuple) else [out]
            row0 = [o[0].clone() if _is_rows(o, self.rows) else None for o in outs]
            if ref is not None:
                if any(_differs(a, b) for a, b in zip(row0, ref[2], strict=True)):
                    self.variant[name] += 1
                outs = [self._patch(o, r) for o, r in zip(outs, ref[2], strict=True)]
                out = tuple(outs) if isinstance(out, tuple) else outs[0]
            self.calls.append((name, ins, row0))
            return out

        return recorded

    def _row0(self, values: dict[Any, Any]) -> dict[Any, torch.Tensor]:
        """Floating-point row inputs only: integer ones are indices into this run's cache layout."""
        rows = self.rows
        return {k: v[0].clone() for k, v in values.items() if _is_rows(v, rows) and v.is_floating_point()}

    def _patch(self, value: Any, row0: torch.Tensor | None) -> Any:
        if (row0 is None or not _is_rows(value, self.rows) or not value.is_floating_point()
                or value[0].shape != row0.shape):
            return value
        value = value.clone()
        value[0] = row0
        return value


def _prompts(runtime: DeepseekV41Runtime, n: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(3, runtime.vocab_size, (PREFILL,), generator=gen).tolist() for _ in range(n)]


def decode_probe(runtime: DeepseekV41Runtime, rec: Recorder, batch: int | str, graphs: bool) -> torch.Tensor:
    """Probe logits of one decode step in a batch of `batch` sequences, or ("mixed") beside a
    companion's prefill; eager calls are recorded (and pinned when `rec.pin` is set)."""
    mixed = batch == "mixed"
    n = 2 if mixed else int(batch)
    blocks = -(-(PREFILL + 1) // runtime.cache_layout().block_size)
    runtime.allocate_cache(n * blocks + 1, n + 1)
    if not graphs:
        runtime.graphs = None
    tables = {s: list(range(1 + (s - 1) * blocks, 1 + s * blocks)) for s in range(1, n + 1)}
    prompts = _prompts(runtime, n)
    decoding = [1] if mixed else list(tables)
    for s in decoding:  # alone: the probe's cache is the same every run
        runtime.forward(ForwardBatch([SequenceSegment(s, tables[s], 0, prompts[s - 1])]))
    segs = [SequenceSegment(s, tables[s], PREFILL, [7 + s]) for s in decoding]
    if mixed:
        segs.append(SequenceSegment(2, tables[2], 0, prompts[1]))
    elif graphs:  # the first step of a shape captures; decode once more at the same position to replay
        runtime.forward(ForwardBatch(segs))
    rows = sum(len(seg.token_ids) for seg in segs)
    rec.on, rec.rows, rec.calls = not graphs, rows, []
    rec.variant, rec.non_op = Counter(), Counter()
    logits = runtime.forward(ForwardBatch(segs)).logits[0].clone()
    rec.on = False
    return logits


def survey(runtime: DeepseekV41Runtime, rec: Recorder, batches: list[int | str]) -> dict:
    report: dict = {}
    for graphs in (False, True):
        mode = "graphs" if graphs else "eager"
        rec.pin = None
        base = decode_probe(runtime, rec, 1, graphs)
        base_calls = rec.calls
        for batch in batches:
            if batch == 1 or (graphs and batch == "mixed"):
                continue
            logits = decode_probe(runtime, rec, batch, graphs)
            entry: dict = {"bitwise": bool(torch.equal(logits, base)),
                           "max_abs_diff": float((logits - base).abs().max())}
            if not graphs:  # once more, pinned to the batch-1 calls: each op judged on its own
                rec.pin = base_calls
                pinned = decode_probe(runtime, rec, batch, graphs)
                rec.pin = None
                entry.update(op_calls=len(rec.calls), pinned_bitwise=bool(torch.equal(pinned, base)),
                             variant_ops=dict(rec.variant),
                             non_op_before=dict(rec.non_op))
            report[f"{mode} batch {batch}"] = entry
            print(f"{mode} batch {batch}: {entry}", flush=True)
    return report


def _interleaved(calls: dict[str, Callable[[], Any]], repeat: int, rounds: int) -> dict[str, float]:
    """Median seconds per call of each of `calls` (synchronised), over `rounds` rounds that each time
    every function `repeat` times in turn, after one untimed call each (compiles, captures graphs): the
    modes share the process's drift (clocks, allocator, host load), which timing them one after the
    other charged to the second."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None
    for fn in calls.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            sync()
            start = time.perf_counter()
            for _ in range(repeat):
                fn()
            sync()
            times[name].append((time.perf_counter() - start) / repeat)
    return {name: statistics.median(t) for name, t in times.items()}


def _decoder(runtime: DeepseekV41Runtime, batch: int, tables: dict[int, list[int]], context: int,
             keep_first: Callable[[torch.Tensor], None]) -> Callable[[], None]:
    """One decode step of slots 1..batch per call, from position `context` on; the first step's slot-1
    logits go to `keep_first`."""
    pos = context

    def decode() -> None:
        nonlocal pos
        segs = [SequenceSegment(s, tables[s], pos, [7 + s]) for s in range(1, batch + 1)]
        logits = runtime.forward(ForwardBatch(segs)).logits
        if pos == context:
            keep_first(logits[0].clone())
        pos += 1

    return decode


def cost(runtimes: dict[str, DeepseekV41Runtime], batches: list[int], context: int, prefill: int,
         steps: int, rounds: int) -> dict:
    """Per mode, decode ms/step per batch size and prefill tok/s of one sequence (module docstring), the
    modes timed in turn; also whether the first decode step's logits of slot 1 (the same prompt in every
    batch) are bitwise those of the first batch size."""
    some = next(iter(runtimes.values()))
    block = some.cache_layout().block_size
    per_seq = -(-(max(context + 2 * steps * rounds + 2, prefill)) // block)
    most = max(batches)
    for runtime in runtimes.values():
        runtime.allocate_cache(1 + most * per_seq, most + 1)
    tables = {s: list(range(1 + (s - 1) * per_seq, 1 + s * per_seq)) for s in range(1, most + 1)}
    gen = torch.Generator().manual_seed(0)
    probe = torch.randint(3, some.vocab_size, (context,), generator=gen).tolist()
    result: dict = {mode: {"decode_ms": {}, "probe_bitwise": {}, "probe_finite": {}} for mode in runtimes}
    first: dict[tuple[str, int], torch.Tensor] = {}
    for batch in batches:
        slots = range(1, batch + 1)
        prompts = [probe] + [torch.randint(3, some.vocab_size, (context,), generator=gen).tolist()
                             for _ in slots[1:]]
        decodes = {}
        for mode, runtime in runtimes.items():
            for s in slots:
                runtime.reset_slot(s)
            runtime.forward(ForwardBatch([SequenceSegment(s, tables[s], 0, p)
                                          for s, p in zip(slots, prompts, strict=True)]))
            keep = partial(first.__setitem__, (mode, batch))
            decodes[mode] = _decoder(runtime, batch, tables, context, keep)
        for mode, seconds in _interleaved(decodes, steps, rounds).items():
            out = result[mode]
            out["decode_ms"][batch] = 1e3 * seconds
            out["probe_bitwise"][batch] = bool(torch.equal(first[mode, batch], first[mode, batches[0]]))
            out["probe_finite"][batch] = bool(first[mode, batch].isfinite().all())
            print(f"{mode} batch {batch}: decode {out['decode_ms'][batch]:.2f} ms/step, probe bitwise "
                  f"{out['probe_bitwise'][batch]}, finite {out['probe_finite'][batch]}", flush=True)
    tokens = torch.randint(3, some.vocab_size, (prefill,), generator=gen).tolist()

    def prefill_once(runtime: DeepseekV41Runtime) -> None:
        runtime.reset_slot(1)
        runtime.forward(ForwardBatch([SequenceSegment(1, tables[1], 0, tokens)]))

    prefills = {mode: partial(prefill_once, runtime) for mode, runtime in runtimes.items()}
    for mode, seconds in _interleaved(prefills, 1, rounds).items():
        result[mode]["prefill_tok_s"] = prefill / seconds
    return result


def survey_ops(backend: str, device: torch.device, invariant: bool) -> Ops:
    """The backend's ops; in invariant mode, before every op has one, the kernels that have an invariant
    mode bound to it and the others as they are (so the survey shows what still varies)."""
    try:
        return get_ops(backend, device, batch_invariant=invariant)
    except BackendError as exc:
        if not invariant:
            raise
        print(f"not every op has a batch-invariant mode yet ({exc}); surveying those that have", flush=True)
        impl = available_backends()[backend]
        reference = get_ops("reference", device)
        table = {n: getattr(reference, n) for n in reference.names} | invariant_ops(impl.ops(), impl.ops())
        return Ops(backend, table, (), impl.plan, batch_invariant=True)


def _save(path: str | None, report: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--experts", type=int, default=None, help="routed experts of the slice (default: Flash's)")
    p.add_argument("--engram-vocab", type=int, default=10_000,
                   help="Engram vocabulary of the slice (100k: ~2.4M table rows, ~20 s to draw on the CPU)")
    p.add_argument("--batch", nargs="+", default=None,
                   help="batch sizes (and 'mixed' in the survey); default 3 8 64 mixed, --cost: 1 8 64")
    p.add_argument("--modes", nargs="+", choices=["default", "invariant"], default=["default", "invariant"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--backend", default="cuda")
    p.add_argument("--config", default="flash-slice", help="flash-slice or a tiny config name")
    p.add_argument("--json", default=None)
    p.add_argument("--cost", action="store_true", help="time both modes instead of surveying")
    p.add_argument("--context", type=int, default=512, help="--cost: tokens per sequence before decoding")
    p.add_argument("--prefill", type=int, default=4096, help="--cost: tokens of the timed prefill")
    p.add_argument("--steps", type=int, default=16,
                   help="--cost: timed decode steps per round and batch size")
    p.add_argument("--rounds", type=int, default=5,
                   help="--cost: rounds, each timing every mode in turn (medians reported)")
    args = p.parse_args()
    device = torch.device(args.device)
    if args.config == "flash-slice":
        config = flash_slice_config(num_layers=args.layers, n_routed_experts=args.experts,
                                    dspark_n_routed_experts=args.experts and min(args.experts, 16),
                                    engram_vocab_size=args.engram_vocab)
        dtype = torch.bfloat16
    else:
        config, dtype = tiny_config(args.config), torch.float32
    default = ["1", "8", "64"] if args.cost else ["3", "8", "64", "mixed"]
    batches = [b if b == "mixed" else int(b) for b in args.batch or default]
    tensors = random_weights(config, device)
    report: dict = {}
    options = RuntimeOptions(cache_precision="release")
    if args.cost:
        runtimes = {}
        for mode in args.modes:
            invariant = mode == "invariant"
            runtimes[mode] = build_runtime(config, dict(tensors), dtype=dtype,
                                           ops=get_ops(args.backend, device, batch_invariant=invariant),
                                           engram_token_map=dummy_token_map(config),
                                           options=replace(options, batch_invariant=invariant))
        report = cost(runtimes, [int(b) for b in batches], args.context, args.prefill, args.steps,
                      args.rounds)
        print(report, flush=True)
        _save(args.json, report)
    else:
        for mode in args.modes:
            print(f"== {mode}", flush=True)
            rec = Recorder()
            ops = survey_ops(args.backend, device, mode == "invariant")
            table = {n: rec.wrap(n, getattr(ops, n)) for n in ops.names}
            recorded = Ops(ops.backend_name, table, ops.fallbacks, ops.plan, ops.batch_invariant)
            runtime = build_runtime(config, dict(tensors), dtype=dtype, ops=recorded,
                                    engram_token_map=dummy_token_map(config), options=options)
            report[mode] = survey(runtime, rec, batches)
            del runtime
            _save(args.json, report)  # after every mode: a time limit keeps what ran
    if args.cost and len(report) == 2:
        base, inv = report["default"], report["invariant"]
        ratios = {f"decode_b{b}": inv["decode_ms"][b] / base["decode_ms"][b] for b in base["decode_ms"]}
        ratios["prefill"] = base["prefill_tok_s"] / inv["prefill_tok_s"]
        print(f"invariant / default time: {ratios}", flush=True)


if __name__ == "__main__":
    main()
