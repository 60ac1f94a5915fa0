"""Where a backend departs from the reference on a model slice, op by op.

Two measurements on the same random weights (benchmarks/reference_forward.py):

* teacher forcing: ONE forward whose ops each run the reference (whose output drives the model) and the
  candidate on the same inputs; per op the relative error of the candidate's output. The MoE also
  reports rows whose top-k expert set differs on those identical inputs (router summation order).
* free runs: the reference and the candidate each run the whole forward; per step the logits error, and
  the discrete decisions that flipped between the runs: MoE top-k expert sets (the reference router
  applied to each run's own MoE input) and indexer top-k entry sets, per layer call. A flip changes
  which weights a row meets, so its error is no longer summation-order noise.

Candidates: `cuda` (the Triton backend; on CPU under TRITON_INTERPRET=1) or `reordered` (the reference
with every linear accumulated in float32 and rounded once: the same rounding points, another summation
order, i.e. the noise floor any correct kernel has).

    python benchmarks/slice_diff.py --device cuda --config flash [--layers 4 --prompt 36 --decode 4]
    python benchmarks/slice_diff.py --device cpu --config tiny:full --dtype float32 --candidate reordered
    TRITON_INTERPRET=1 python benchmarks/slice_diff.py --device cpu --config tiny:full --candidate cuda
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from deepinfer.checkpoint.randomize import dummy_token_map, random_weights
from deepinfer.config import ModelConfig
from deepinfer.models.deepseek_v41.runtime import RuntimeOptions, build_runtime
from deepinfer.models.interface import ForwardBatch, SequenceSegment
from deepinfer.ops import Ops, get_ops
from deepinfer.ops.reference import REFERENCE_OPS
from deepinfer.ops.reference import moe as ref_moe
from deepinfer.testing.configs import flash_slice_config, tiny_config

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
_CLONE_LIMIT = 1 << 26  # elements: bigger tensor arguments (the KV pool) are shared, not cloned


def reference_forward_module() -> Any:
    path = Path(__file__).resolve().parent / "reference_forward.py"
    spec = importlib.util.spec_from_file_location("reference_forward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative Frobenius error (0 when both are 0)."""
    num = float((got.double() - want.double()).norm())
    den = float(want.double().norm())
    return num / den if den else num


def row_sets_differ(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[rows] bool: rows of two index tensors [rows, k] whose index sets differ."""
    return (a.sort(-1).values != b.sort(-1).values).any(-1)


# --- candidate ops


def reordered_ops(device: str) -> Ops:
    """The reference, every linear computed in float32 and rounded once to its output dtype."""
    ref = get_ops("reference", device)

    def linear(x: torch.Tensor, prepared: Any, out_dtype: torch.dtype) -> torch.Tensor:
        return ref.linear(x, prepared, torch.float32).to(out_dtype)

    table = {name: getattr(ref, name) for name in REFERENCE_OPS}
    return Ops("reordered", {**table, "linear": linear}, ())


def candidate_ops(name: str, device: str, only: set[str] | None = None) -> Ops:
    """`only`: the candidate's ops of these names, the reference for the rest."""
    if name == "reordered":
        return reordered_ops(device)
    plan = None
    if name == "cuda" and device == "cpu":  # the Triton interpreter: the backend's table, unchecked
        from deepinfer_kernels_cuda.backend import CudaBackend

        own = CudaBackend().ops()
    else:
        ops = get_ops(name, device)
        own, plan = {n: getattr(ops, n) for n in ops.names if n not in ops.fallbacks}, ops.plan
    own = {n: f for n, f in own.items() if only is None or n in only}
    return Ops(name, {**REFERENCE_OPS, **own}, tuple(sorted(set(REFERENCE_OPS) - set(own))), plan)


def candidate_route(cand: Ops) -> Callable | None:
    """(x, layer, mask) -> expert ids [T, k] by the candidate's own router, when it has its own."""
    if cand.backend_name != "cuda":
        return None
    from deepinfer_kernels_cuda import moe as cuda_moe

    def route(x: torch.Tensor, layer: Any, mask: torch.Tensor | None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        logits = cuda_moe.router_logits(x2, layer.gate)
        return cuda_moe.route(logits, layer.bias, layer.bias_vl, mask, layer.topk, layer.route_scale)[1]

    return route


# --- teacher forcing


@dataclass(frozen=True)
class Pair:
    """One weight prepared by both backends."""

    ref: Any
    cand: Any


@dataclass
class OpRecord:
    calls: int = 0
    worst: float = 0.0
    worst_call: str = ""
    errors: list[float] = field(default_factory=list)
    flipped_rows: int = 0  # MoE: rows whose expert set differs on identical inputs (excluded from errors)
    rows: int = 0


def _clone(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.clone() if obj.numel() <= _CLONE_LIMIT else obj
    if isinstance(obj, (tuple, list)):
        return type(obj)(_clone(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    return obj


def _shape(args: tuple) -> str:
    return "x".join(str(d) for d in args[0].shape) if args and isinstance(args[0], torch.Tensor) else "?"


class TeacherForcing:
    """An Ops table whose every op runs reference and candidate on the same inputs (see module doc)."""

    def __init__(self, ref: Ops, cand: Ops) -> None:
        self.ref, self.cand = ref, cand
        self.records: dict[str, OpRecord] = defaultdict(OpRecord)
        self.cand_route = candidate_route(cand)
        own = set(cand.names) - set(cand.fallbacks)
        table: dict[str, Callable] = {}
        for name in ref.names:
            if name in ("prepare_linear", "prepare_experts"):
                table[name] = self._prepare(name)
            elif name == "linear":
                table[name] = self._linear
            elif name == "moe":
                table[name] = self._moe
            elif name in own and getattr(cand, name) is not getattr(ref, name):
                table[name] = self._generic(name)
            else:
                table[name] = getattr(ref, name)
        self.ops = Ops(f"teacher({cand.backend_name})", table, ())

    def _prepare(self, name: str) -> Callable:
        def prepare(*args: Any, **kwargs: Any) -> Pair:
            return Pair(getattr(self.ref, name)(*args, **kwargs), getattr(self.cand, name)(*args, **kwargs))

        return prepare

    def _note(self, key: str, err: float, where: str) -> None:
        r = self.records[key]
        r.calls += 1
        r.errors.append(err)
        if err >= r.worst:
            r.worst, r.worst_call = err, where

    def _compare(self, name: str, want: Any, got: Any, where: str) -> None:
        if isinstance(want, (tuple, list)):
            for i, (w, g) in enumerate(zip(want, got, strict=True)):
                self._compare(f"{name}[{i}]", w, g, where)
        elif isinstance(want, torch.Tensor) and want.is_floating_point():
            self._note(name, rel(got, want), where)
        elif isinstance(want, torch.Tensor) and want.ndim == 2 and want.dtype in (torch.int32, torch.int64):
            # index outputs (top-k entries): share of rows whose sets differ
            self._note(name, float(row_sets_differ(got, want).float().mean()) if want.numel() else 0.0, where)
        elif isinstance(want, torch.Tensor):
            self._note(name, float((got != want).float().mean()) if want.numel() else 0.0, where)

    def _generic(self, name: str) -> Callable:
        ref_fn, cand_fn = getattr(self.ref, name), getattr(self.cand, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            cargs, ckwargs = _clone(args), _clone(kwargs)
            out = ref_fn(*args, **kwargs)
            self._compare(name, out, cand_fn(*cargs, **ckwargs), _shape(args))
            return out

        return call

    def _linear(self, x: torch.Tensor, p: Pair, out_dtype: torch.dtype) -> torch.Tensor:
        out = self.ref.linear(x, p.ref, out_dtype)
        got = self.cand.linear(x.clone(), p.cand, out_dtype)
        kind = getattr(p.ref, "kind", "?")
        groups = getattr(p.ref, "groups", 1)
        key = f"linear {kind}{'/g' + str(groups) if groups > 1 else ''} {tuple(out.shape[-1:])}"
        self._compare(key, out, got, _shape((x,)))
        return out

    def _moe(self, x: torch.Tensor, layer: Any, image_mask: torch.Tensor | None = None) -> torch.Tensor:
        def side(pick: Callable[[Pair], Any]) -> Any:
            return replace(layer, experts=pick(layer.experts), shared_w1=pick(layer.shared_w1),
                           shared_w3=pick(layer.shared_w3), shared_w2=pick(layer.shared_w2))

        ref_layer, cand_layer = side(lambda p: p.ref), side(lambda p: p.cand)
        out = self.ref.moe(x, ref_layer, image_mask)
        got = self.cand.moe(x.clone(), cand_layer, image_mask)
        key = f"moe E{layer.gate.shape[0]} k{layer.topk}"
        rows = x.reshape(-1, x.shape[-1]).shape[0]
        same = torch.ones(rows, dtype=torch.bool, device=x.device)
        if self.cand_route is not None and rows:
            ids = ref_moe.route(x.reshape(rows, -1), ref_layer, image_mask)[1]
            same = ~row_sets_differ(self.cand_route(x, cand_layer, image_mask).long(), ids)
        r = self.records[key]
        r.flipped_rows += int((~same).sum())
        r.rows += rows
        if bool(same.any()):
            self._compare(key, out.reshape(rows, -1)[same], got.reshape(rows, -1)[same], _shape((x,)))
        return out

    def table(self) -> list[dict]:
        return [
            {"op": k, "calls": r.calls, "max_rel": r.worst, "worst_input": r.worst_call,
             "mean_rel": sum(r.errors) / len(r.errors) if r.errors else None,
             **({"router_flipped_rows": r.flipped_rows, "rows": r.rows} if r.rows else {})}
            for k, r in sorted(self.records.items())
        ]


# --- runs


@dataclass
class Decisions:
    """Per step (forward) and per MoE / indexer_topk call of one run, in call order: the selected ids
    [rows, k]."""

    moe: list[list[torch.Tensor]] = field(default_factory=list)
    topk: list[list[torch.Tensor]] = field(default_factory=list)

    def new_step(self) -> None:
        self.moe.append([])
        self.topk.append([])


def recording(ops: Ops, decisions: Decisions) -> Ops:
    """`ops` with MoE routing (by the reference router on the call's input) and indexer top-k recorded."""
    table = {name: getattr(ops, name) for name in ops.names}
    moe_fn, topk_fn = table["moe"], table["indexer_topk"]

    def moe(x: torch.Tensor, layer: Any, image_mask: torch.Tensor | None = None) -> torch.Tensor:
        decisions.moe[-1].append(ref_moe.route(x.reshape(-1, x.shape[-1]), layer, image_mask)[1].cpu())
        return moe_fn(x, layer, image_mask)

    def indexer_topk(*args: Any, **kwargs: Any) -> Any:
        out = topk_fn(*args, **kwargs)
        decisions.topk[-1].append(out[0].cpu())
        return out

    return Ops(ops.backend_name, {**table, "moe": moe, "indexer_topk": indexer_topk}, ops.fallbacks, ops.plan)


def run_slice(config: ModelConfig, tensors: dict, token_map: list[int] | None, ops: Ops, dtype: torch.dtype,
              prompt: list[int], decode: list[int] | int, graphs: bool = False,
              decisions: Decisions | None = None) -> list[torch.Tensor]:
    """float32 logits on the host: the prefill (every position), then each decode step, fed `decode`'s
    tokens (teacher forcing) or, given a count, greedily; `decisions` (of `recording(ops)`) gets a new
    step before each forward (its host copies cannot be captured: graphs off). The runtime releases
    checkpoint entries it has consumed: it gets its own dict of the tensors."""
    new_step = decisions.new_step if decisions is not None else lambda: None
    steps = decode if isinstance(decode, int) else len(decode)
    runtime = build_runtime(config, dict(tensors), dtype=dtype, ops=ops, engram_token_map=token_map,
                            options=RuntimeOptions(cache_precision="release", cuda_graphs=graphs))
    blocks = -(-(len(prompt) + steps) // runtime.cache_layout().block_size)
    runtime.allocate_cache(blocks + 1, 2)
    table = list(range(1, blocks + 1))
    new_step()
    out = runtime.forward(ForwardBatch([SequenceSegment(1, table, 0, prompt, logits="all")]))
    logits = [out.logits.float().cpu()]
    for i in range(steps):
        token = int(logits[-1][-1].argmax()) if isinstance(decode, int) else decode[i]
        new_step()
        out = runtime.forward(ForwardBatch([SequenceSegment(1, table, len(prompt) + i, [token])]))
        logits.append(out.logits.float().cpu())
    del runtime
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return logits


def free_run_report(want: list[torch.Tensor], got: list[torch.Tensor], dw: Decisions, dg: Decisions) -> dict:
    """Per step of one sequence: logits error over all rows and over the causally clean rows (those before
    the first row whose MoE routing or indexer top-k flipped in any layer: causal attention keeps a flip
    out of earlier rows), and the flipped rows per call."""
    report = []
    for s in range(len(want)):
        flips = [row_sets_differ(g, w) for g, w in zip(dg.moe[s], dw.moe[s], strict=True)]
        topk = [row_sets_differ(g, w) for g, w in zip(dg.topk[s], dw.topk[s], strict=True)]
        rows = want[s].shape[0]
        # one row per logits row (DSpark's blocks run outside the forward)
        flagged = [f for f in flips + topk if f.shape[0] == rows]
        hit = torch.stack(flagged).any(0) if flagged else torch.zeros(rows, dtype=torch.bool)
        first = int(hit.nonzero()[0, 0]) if bool(hit.any()) else rows
        report.append({
            "step": "prefill" if s == 0 else f"decode {s}",
            "rel": rel(got[s], want[s]),
            "rel_clean_rows": rel(got[s][:first], want[s][:first]) if first else None,
            "clean_rows": first, "rows": rows,
            "moe_flipped_rows_per_call": [int(f.sum()) for f in flips],
            "topk_flipped_rows_per_call": [int(f.sum()) for f in topk],
            "argmax_equal": float((got[s].argmax(-1) == want[s].argmax(-1)).float().mean()),
        })
    return {"steps": report}


def setup(args: argparse.Namespace) -> tuple[ModelConfig, dict, list[int] | None, list[int], list[int]]:
    if args.config == "flash":
        kwargs = {"n_routed_experts": args.experts} if args.experts else {}
        config = flash_slice_config(num_layers=args.layers, **kwargs)
    else:
        config = tiny_config(args.config.split(":", 1)[1])
    tensors = random_weights(config, torch.device(args.device))
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, config.text.vocab_size, (args.prompt + args.decode,), generator=gen).tolist()
    return config, tensors, dummy_token_map(config), tokens[:args.prompt], tokens[args.prompt:]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--config", default="flash", help="flash | tiny:<name>")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--experts", type=int, default=None, help="flash: routed experts (default 384)")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="bfloat16")
    p.add_argument("--prompt", type=int, default=36)
    p.add_argument("--decode", type=int, default=4)
    p.add_argument("--candidate", action="append", help="cuda | reordered (repeatable; default both)")
    p.add_argument("--ops", default=None, help="comma-separated: only these ops from the candidate")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    dtype = _DTYPES[args.dtype]
    config, tensors, token_map, prompt, decode = setup(args)
    ref = get_ops("reference", args.device)
    result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}

    dw = Decisions()
    want = run_slice(config, tensors, token_map, recording(ref, dw), dtype, prompt, decode, decisions=dw)
    for name in args.candidate or ["reordered", "cuda"]:
        cand = candidate_ops(name, args.device, set(args.ops.split(",")) if args.ops else None)
        dg = Decisions()
        got = run_slice(config, tensors, token_map, recording(cand, dg), dtype, prompt, decode, decisions=dg)
        free = free_run_report(want, got, dw, dg)
        teacher = TeacherForcing(ref, cand)
        run_slice(config, tensors, token_map, teacher.ops, dtype, prompt, decode)
        result[name] = {"free": free, "teacher": teacher.table()}
        print(f"== {name} vs reference ({args.config}, {args.dtype})")
        for row in free["steps"]:
            print(f"  free {row['step']:>9}: rel {row['rel']:.4f}  rel on clean rows "
                  f"{row['rel_clean_rows']}  ({row['clean_rows']}/{row['rows']} rows)  "
                  f"MoE flips/call {row['moe_flipped_rows_per_call']}  "
                  f"top-k flips/call {row['topk_flipped_rows_per_call']}  "
                  f"argmax eq {row['argmax_equal']:.3f}")
        for row in teacher.table():
            extra = (f"  router flips {row['router_flipped_rows']}/{row['rows']} rows"
                     if "router_flipped_rows" in row else "")
            print(f"  teacher {row['op']:<34} calls {row['calls']:>3}  max {row['max_rel']:.2e} "
                  f"(at {row['worst_input']})  mean {row['mean_rel'] or 0:.2e}{extra}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
