"""Speculative decoding benchmark: end-to-end engine speed per speculator / K / schedule / batch, and the
verification cost per K on a Flash-width slice.

    # engine sweep (offline LLM.generate): per-user tok/s and throughput at each batch, mean accepted
    # length, acceptance rate, and throughput / per-user speed at matched speed of no speculation
    python benchmarks/spec_decode.py engine [--model DIR] [--speculators dspark,ngram] [--ks 3,5,1]
        [--schedules fixed,confidence,confidence-sync] [--confidence-ks 3,5] [--batches 1,8,64]
        [--max-tokens 64] [--budget-s 90] [--sync] [--json-out FILE]
    # step cost per K (model runtime + exact verification, CUDA graphs as the engine replays them):
    # decode step, verification step of 1 + K rows per sequence, DSpark draft step; modelled speed-ups
    python benchmarks/spec_decode.py cost [--slice-layers 5 | --full-depth | --tiny [--shared-params]]
        [--batches 1,8,64] [--ks 1,2,3,4,5] [--acceptance 0.5,0.7,0.9] [--anchor-length 3.51 --anchor-k 5]
        [--engram-vocab 10000] [--budget-s 60] [--json-out FILE]
    # n-gram proposer host cost per request and step at long histories (CPU)
    python benchmarks/spec_decode.py ngram [--history 8192] [--batches 1,64]

engine: without --model it writes the tiny `full` config (random weights, DSpark block size 4) to a
temporary directory: the machinery is measured, a random drafter's acceptance is not meaningful. One
engine per (speculator, K, schedule), built with max_num_seqs = the largest batch and reused for every
batch (async scheduling on, the default; --sync turns it off for every engine, a schedule named with
"-sync", e.g. confidence-sync, for that engine: the confidence schedule then plans from the newest
confidences (waiting for them) instead of the estimates of the drafts before). Each engine captures
CUDA graphs of the measured batch sizes only (cuda_graph_sizes = --batches) at the table widths of
--max-model-len (the default keeps one width); kernels compiled for an earlier engine are reused (same
process), so an engine after the first compiles only its new verification shapes (build_s in the
rows). Requests ignore EOS, so each generates --max-tokens tokens; a warm-up generate at the same
batch runs first. Per-user tok/s = mean over requests of output tokens / (finish - arrival);
throughput = all output tokens / wall time. "matched": the no-speculation curve over the batches
(per-user speed vs throughput, interpolated in log space) read at this point's throughput (per-user
speed-up) and at its per-user speed (throughput ratio); None outside that curve. A second table splits
an engine step (`step_split`): wall ms, worker ms, engine CPU ms and, on CUDA, the step's GPU span
(wall - span = the device's idle time between steps, e.g. the speculative hand-off), and at
temperature 0 how many requests' outputs equal no speculation's (exact verification keeps them equal,
except where a verification row's logits differ numerically from the decode row's at a near-tie).
Engines past --budget-s are skipped (listed): none first, then each K of --ks in the order given.

cost: random weights cannot show acceptance, so this measures what a speed-up at a given acceptance
follows from: t_dec(B) = a decode step of B sequences, t_ver(B, K) = a step verifying K drafts per
sequence (forward over 1 + K rows each, logits of every row, greedy verification), t_draft(B, K) = the
DSpark proposer's step (draft forward, K Markov/sampling steps, confidences). With i.i.d. acceptance a,
a verifying step emits E = (1 - a^(K+1)) / (1 - a) tokens per sequence, so the modelled per-user
speed-up is E * t_dec / t_ver (prompt lookup: drafting is host work) or E * t_dec / (t_ver + t_draft)
(DSpark); engine overheads are not in it (the engine sweep measures them on the trained model).
--anchor-length L adds the a at which K = --anchor-k drafts emit L tokens (the official DSpark's 3.51
at K = 5 on V4.1-Flash). Models: a Flash-width slice of --slice-layers layers, or --full-depth: the
released Flash config (40 backbone layers of their real kinds and compress ratios, 3 DSpark blocks of
Flash widths) whose layers share their parameters (`shared_weights`: one tensor per name inside the
layer and shape, distinct within a layer, so every layer still streams its own ~0.3 GB of touched
weights from HBM at batch 1, past the 50 MB L2), so that the 40 layers fit on one GPU; Engram tables
over an --engram-vocab hash vocabulary.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from deepinfer.checkpoint.randomize import dummy_token_map, random_group, random_weights, weight_groups
from deepinfer.config import ModelConfig, engram_table_rows
from deepinfer.ops import Ops
from deepinfer.sampling import SamplingParams
from deepinfer.speculators import registry
from deepinfer.testing.configs import flash_slice_config, tiny_config
from deepinfer.testing.flash import flash_config_dict

# prompts with some repetition, as real text and code have (what prompt lookup feeds on)
TEXTS = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the",
    "import os\nimport sys\nfor name in os.listdir(sys.argv[1]):\n    print(name)\n",
    "Speculative decoding drafts several tokens and verifies them in one forward pass of the model.",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,",
    "Once upon a time there was a small village by the sea. Every morning the fishermen",
    "SELECT name, age FROM users WHERE age > 30 ORDER BY age DESC; SELECT name FROM",
]


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def ensure_speculators() -> None:
    """Register deepinfer-spec's plugins directly when the installed metadata predates its entry
    points (an editable install not re-synced since they were added)."""
    if {"dspark", "ngram"} <= set(registry.available_speculators()):
        return
    from deepinfer_spec.dspark import DSparkProposer
    from deepinfer_spec.ngram import NgramProposer

    found = {**registry.available_speculators(), "dspark": DSparkProposer, "ngram": NgramProposer}
    registry.available_speculators = lambda: found


def save(args: argparse.Namespace, results: list[dict[str, Any]], echo: bool = True) -> None:
    """Print the newest row; rewrite --json-out with every row so far (a run cut short keeps them)."""
    if echo:
        print(json.dumps(results[-1]), flush=True)
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=1))


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A markdown table of `columns` (floats rounded to 3 significant decimals)."""
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return "-" if v is None else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


# ---- engine sweep ---------------------------------------------------------------------------------


def prompts(llm: Any, batch: int) -> list[Any]:
    if llm.tokenizer is not None:
        return [TEXTS[i % len(TEXTS)] for i in range(batch)]
    vocab = llm.engine.vocab_size
    return [[5 + (7 * i + 3 * (j % 11)) % (vocab - 5) for j in range(40)] for i in range(batch)]


def measure(llm: Any, batch: int, params: SamplingParams) -> dict[str, Any]:
    """One warm-up and one measured generate of `batch` requests on a built engine."""
    llm.generate(prompts(llm, batch), params, use_tqdm=False)
    stats = llm.engine.stats

    def counters() -> tuple[int, int, int]:
        return stats.spec_verify_steps, stats.spec_draft_tokens, stats.spec_accepted_tokens

    before, first_step = counters(), len(stats.steps)
    start, cpu_start = time.perf_counter(), time.process_time()
    outs = llm.generate(prompts(llm, batch), params, use_tqdm=False)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    steps, drafted, accepted = (now - b for now, b in zip(counters(), before, strict=True))
    taken = list(stats.steps)[first_step:]
    tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    per_user = [len(o.outputs[0].token_ids) / (o.metrics.finish_time - o.metrics.arrival_time) for o in outs]
    return {
        "outputs": [o.outputs[0].token_ids for o in outs],  # for the comparison with no speculation
        "batch": batch, "tokens": tokens, "wall_s": round(wall, 3),
        "throughput_tok_s": round(tokens / wall, 1), "per_user_tok_s": round(statistics.mean(per_user), 1),
        "tok_per_cpu_s": round(tokens / cpu, 1),
        "mean_accepted_length": round(1 + accepted / steps, 3) if steps else None,
        "acceptance_rate": round(accepted / drafted, 3) if drafted else None,
        **step_split(taken, wall),
    }


def step_split(taken: list[Any], wall: float) -> dict[str, float | None]:
    """Per engine step: wall ms, the worker's wall ms (plan to launch, and with a speculator up to the
    verified tokens on the host and drafting launched), the engine thread's CPU ms (planning, commit,
    outputs) and, on CUDA, the GPU span of the step (first to last queued work): wall - GPU span is
    the device's idle time between steps."""
    if not taken:
        return {}
    gpu = [s.gpu_s for s in taken if s.gpu_s is not None]

    def mean_ms(values: list[float]) -> float:
        return round(1e3 * statistics.mean(values), 3)

    return {
        "steps": len(taken), "step_ms": round(1e3 * wall / len(taken), 3),
        "worker_ms": mean_ms([s.device_s for s in taken]),
        "engine_cpu_ms": mean_ms([s.schedule_s + s.process_s for s in taken]),
        "gpu_span_ms": mean_ms(gpu) if gpu else None,
    }


def interpolate(xs: list[float], ys: list[float], x: float) -> float | None:
    """y at x on the piecewise log-log line through (xs, ys) (xs in any order); None outside."""
    pts = sorted(zip(xs, ys, strict=True))
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if x0 <= x <= x1:
            if x1 == x0:
                return y0
            f = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return math.exp(math.log(y0) + f * (math.log(y1) - math.log(y0)))
    return pts[0][1] if len(pts) == 1 and pts[0][0] == x else None


def add_matched(results: list[dict[str, Any]]) -> None:
    """Per-user speed-up at the no-speculation throughput, and throughput ratio at its per-user speed."""
    base = [r for r in results if r["speculator"] == "none"]
    thr = [r["throughput_tok_s"] for r in base]
    user = [r["per_user_tok_s"] for r in base]
    by_batch = {r["batch"]: r for r in base}
    for r in results:
        if r["speculator"] == "none" or r.get("skipped"):
            continue
        same = by_batch.get(r["batch"])
        r["per_user_speedup"] = round(r["per_user_tok_s"] / same["per_user_tok_s"], 3) if same else None
        u = interpolate(thr, user, r["throughput_tok_s"])
        t = interpolate(user, thr, r["per_user_tok_s"])
        r["per_user_x_at_matched_throughput"] = round(r["per_user_tok_s"] / u, 3) if u else None
        r["throughput_x_at_matched_per_user"] = round(r["throughput_tok_s"] / t, 3) if t else None


def engine_sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    from deepinfer.entrypoints.llm import LLM

    ensure_speculators()
    model = args.model
    if model is None:
        from deepinfer.testing import write_tiny_checkpoint

        model = write_tiny_checkpoint("full", tempfile.mkdtemp(prefix="spec-bench-"), seed=0)
    block = json.loads((model / "config.json").read_text())["text_config"].get("dspark_block_size") or 0
    batches = ints(args.batches)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, ignore_eos=True, seed=1)
    configs: list[tuple[str, int, str]] = [("none", 0, "-")]
    confidence_ks = ints(args.confidence_ks or args.ks)
    for k in ints(args.ks):  # in the order given: what the budget keeps first
        schedules = [s for s in args.schedules.split(",")
                     if s.removesuffix("-sync") != "confidence" or k in confidence_ks]
        configs += [(name, k, schedule) for schedule in schedules for name in args.speculators.split(",")
                    if not (name == "dspark" and k > block)]
    deadline = time.perf_counter() + args.budget_s
    results: list[dict[str, Any]] = []
    plain: dict[int, list[list[int]]] = {}  # batch -> no speculation's greedy outputs
    for name, k, schedule in configs:
        row = {"speculator": name, "k": k, "schedule": schedule}
        if time.perf_counter() > deadline:
            results += [{**row, "batch": b, "skipped": "budget"} for b in batches]
            print(f"skipped (budget): {name} K={k} {schedule}", flush=True)
            continue
        spec = {} if name == "none" else dict(speculator=name, num_draft_tokens=k,
                                              spec_schedule=schedule.removesuffix("-sync"))
        t0 = time.perf_counter()
        llm = LLM(model, max_num_seqs=max(batches), max_model_len=args.max_model_len, log_stats_interval=0,
                  async_scheduling=not (args.sync or schedule.endswith("-sync")),
                  cuda_graph_sizes=sorted(set(batches)), **spec)
        build_s = round(time.perf_counter() - t0, 1)
        try:
            for batch in batches:
                measured = measure(llm, batch, params)
                outputs = measured.pop("outputs")
                if name == "none":
                    plain[batch] = outputs
                elif batch in plain and args.temperature == 0:
                    same = sum(a == b for a, b in zip(outputs, plain[batch], strict=True))
                    measured["same_as_none"] = f"{same}/{len(outputs)}"
                results.append({**row, **measured, "build_s": build_s})
                save(args, results)
        finally:
            llm.engine.close()
            del llm
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    add_matched(results)
    save(args, results, echo=False)
    done = [r for r in results if not r.get("skipped")]
    print(table(sorted(done, key=lambda r: (r["batch"], r["speculator"] != "none")),
                ["batch", "speculator", "k", "schedule", "per_user_tok_s", "throughput_tok_s",
                 "mean_accepted_length", "acceptance_rate", "per_user_speedup",
                 "per_user_x_at_matched_throughput", "throughput_x_at_matched_per_user"]))
    print(table(sorted(done, key=lambda r: (r["batch"], r["speculator"] != "none")),
                ["batch", "speculator", "k", "schedule", "steps", "step_ms", "worker_ms", "engine_cpu_ms",
                 "gpu_span_ms", "same_as_none"]))
    return results


# ---- verification cost per K ----------------------------------------------------------------------


def full_depth_config(engram_vocab: int) -> ModelConfig:
    """The released Flash config (40 backbone layers of their real kinds and compress ratios, 3 DSpark
    blocks) with Engram tables over an `engram_vocab` hash vocabulary (Flash's 16M: 2 x 100 GB)."""
    cfg = flash_config_dict()
    t = cfg["text_config"]
    t.update(engram_vocab_size=engram_vocab, engram_num_embeddings=engram_table_rows(
        t["engram_layer_ids"], t["engram_max_ngram_size"], t["engram_n_heads"], engram_vocab))
    return ModelConfig.from_hf_dict(cfg)


def _slot(name: str) -> tuple[str, str]:
    """(kind, name inside the layer) of a tensor: "layers" (backbone) or "mtp" (DSpark) without the
    layer's index; ("", name) for a tensor outside the layers."""
    m = re.fullmatch(r"(layers|mtp)\.\d+\.(.+)", name)
    return (m[1], m[2]) if m else ("", name)


def shared_weights(config: ModelConfig, device: torch.device, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every tensor of `config`'s inventory, drawn once per (layer kind, name inside the layer, shape,
    dtype) and aliased by every layer that has it: the backbone layers share one set, the DSpark blocks
    another. Different tensors of one layer (the 384 experts, w1 and w3) stay distinct, so a step reads
    as many different bytes per layer as the real model (a layer's weights far exceed the L2)."""
    slots: dict[tuple[Any, ...], list[torch.Tensor]] = {}
    tensors: dict[str, torch.Tensor] = {}
    gen = torch.Generator(device=device).manual_seed(seed)
    for group in weight_groups(config):
        spec = group[0]
        key = (*_slot(spec.name), tuple(spec.shape), spec.dtype)
        if key not in slots:
            slots[key] = list(random_group(group, seed, device, gen).values())
        tensors.update(zip((s.name for s in group), slots[key], strict=True))
    return tensors


def _same(a: Any, b: Any) -> bool:
    """Equal arguments: tensors of one shape, dtype and device with the same bits; tuples item by item."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and a.device == b.device
                and torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                                b.contiguous().reshape(-1).view(torch.uint8)))
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


class ReusedPreparation:
    """A prepare op (`prepare_linear`, `prepare_experts`) returning its earlier result for arguments equal
    to an earlier call's: layers built from shared tensors then share their prepared weights too, although
    the model stacks the experts and concatenates fused linears into a fresh tensor per layer first.
    `forget()` drops the arguments held for the comparison (call it once the model is built)."""

    def __init__(self, prepare: Callable[..., Any]) -> None:
        self.prepare = prepare
        self.done: list[tuple[tuple[Any, ...], Any]] = []
        self.reused = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = (*args, *sorted(kwargs.items()))
        for seen, prepared in self.done:
            if _same(seen, key):
                self.reused += 1
                return prepared
        prepared = self.prepare(*args, **kwargs)
        self.done.append((key, prepared))
        return prepared

    def forget(self) -> None:
        self.done.clear()


def sharing_ops(ops: Ops) -> tuple[Ops, list[ReusedPreparation]]:
    """`ops` with its weight preparation wrapped in `ReusedPreparation` (and the wrappers)."""
    table = {name: getattr(ops, name) for name in ops.names}
    wrapped = [ReusedPreparation(table[name]) for name in ("prepare_linear", "prepare_experts")]
    table.update(prepare_linear=wrapped[0], prepare_experts=wrapped[1])
    return Ops(ops.backend_name, table, ops.fallbacks, ops.plan, ops.batch_invariant), wrapped


def cost_config(args: argparse.Namespace) -> tuple[ModelConfig, str]:
    """The model the cost sweep builds, and its description."""
    if args.tiny:
        return tiny_config("full"), "tiny full config"
    if args.full_depth:
        return full_depth_config(args.engram_vocab), "Flash config, 40 layers + 3 DSpark blocks"
    config = flash_slice_config(num_layers=args.slice_layers, engram_vocab_size=args.engram_vocab)
    return config, f"Flash slice, {args.slice_layers} layers"


def build_cost_runtime(config: ModelConfig, device: torch.device, graph_sizes: list[int],
                       shared: bool) -> Any:
    """A runtime with random weights (`shared`: `shared_weights`, prepared once per distinct tensor), its
    CUDA graphs bucketed at `graph_sizes` (the measured batches: no step pads to a larger one)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from reference_forward import _ops

    from deepinfer.models.deepseek_v41.runtime import RuntimeOptions, build_runtime

    block = config.text.dspark_block_size or 0
    options = RuntimeOptions(cache_precision="release" if device.type == "cuda" else "exact",
                             max_backtrack=max(block, 5) + 1, cuda_graph_sizes=tuple(graph_sizes))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    ops, wrapped = _ops(None, device), []
    if shared:
        ops, wrapped = sharing_ops(ops)
    tensors = shared_weights(config, device) if shared else random_weights(config, device)
    runtime = build_runtime(config, tensors, dtype=dtype, ops=ops, engram_token_map=dummy_token_map(config),
                            options=options)
    for op in wrapped:
        op.forget()
    return runtime


def timed(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    """Median milliseconds of `fn` (synchronised), after one untimed call (graph capture, autotune)."""
    fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def emitted(a: float, k: int) -> float:
    """Tokens a verifying step emits per sequence at i.i.d. per-draft acceptance a with K drafts."""
    return k + 1.0 if a == 1 else (1 - a ** (k + 1)) / (1 - a)


def acceptance_for(length: float, k: int) -> float:
    """The per-draft acceptance a at which a step with K drafts emits `length` tokens (bisection)."""
    if not 1 <= length < k + 1:
        raise ValueError(f"mean accepted length {length} at K={k}: must be in [1, {k + 1})")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if emitted(mid, k) < length else (lo, mid)
    return (lo + hi) / 2


def cost_sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    from deepinfer.engine.model_runner import ModelRunner
    from deepinfer.sampling.sampler import Sampler
    from deepinfer.speculators.interface import History, ProposeBatch, ProposeRequest, SpeculatorConfig

    device = torch.device(args.device)
    t0 = time.perf_counter()
    batches, ks = ints(args.batches), ints(args.ks)
    config, what = cost_config(args)
    shared = args.full_depth or args.shared_params
    runtime = build_cost_runtime(config, device, batches, shared)
    slots = list(range(1, max(batches) + 1))
    runtime.allocate_cache(num_blocks=len(slots) + 1, num_slots=len(slots) + 1)
    blocks = list(range(1, len(slots) + 1))  # one block per sequence: positions 0..K, well inside one
    runner = ModelRunner(runtime, Sampler(runtime.eos_token_id))
    memory = f", {torch.cuda.memory_allocated(device) / 2**30:.1f} GiB" if device.type == "cuda" else ""
    print(f"{what}{' (shared parameters)' if shared else ''} built in {time.perf_counter() - t0:.1f} s "
          f"on {device}{memory}", flush=True)
    drafter = None
    block = runtime.dspark.block_size if runtime.dspark is not None else 0
    if block:
        from deepinfer_spec.dspark import DSparkProposer

        drafter = DSparkProposer.build(runtime, SpeculatorConfig(min(max(ks), block)))
    greedy = SamplingParams(temperature=0)
    rates = floats(args.acceptance)
    if args.anchor_length:
        anchor = round(acceptance_for(args.anchor_length, args.anchor_k), 3)
        print(f"anchor: mean accepted length {args.anchor_length} at K={args.anchor_k} -> a = {anchor}")
        rates = [anchor, *rates]
    deadline = time.perf_counter() + args.budget_s
    results: list[dict[str, Any]] = []
    for batch in batches:
        if time.perf_counter() > deadline:
            results += [{"batch": batch, "k": k, "skipped": "budget"} for k in ks]
            continue

        def step(k: int, batch: int = batch) -> float:
            return runner.time_verification(batch * (k + 1), k + 1, slots[:batch], blocks[:batch])

        dec = timed(lambda: step(0), device, args.reps)
        for k in ks:
            if time.perf_counter() > deadline:
                results.append({"batch": batch, "k": k, "skipped": "budget"})
                continue
            ver = timed(lambda k=k: step(k), device, args.reps)
            draft = None
            if drafter is not None and k <= block:
                # drafts after position 7 (a cleared slot), each sequence from its own token (as
                # time_verification's rows: equal ones would route every sequence to the same experts)
                golden = [(3 + i) * 7919 % runtime.vocab_size for i in range(batch)]
                reqs = [ProposeRequest(i, s, 7, History([g] * 8, []), greedy, i, k)
                        for i, (s, g) in enumerate(zip(slots[:batch], golden, strict=True))]
                sampled = torch.tensor(golden, dtype=torch.int64, device=device)
                draft = timed(lambda reqs=reqs, sampled=sampled: drafter.propose(ProposeBatch(reqs, sampled)),
                              device, args.reps)
            row = {"batch": batch, "k": k, "decode_ms": round(dec, 3), "verify_ms": round(ver, 3),
                   "verify_x_decode": round(ver / dec, 3), "dspark_draft_ms": None if draft is None else
                   round(draft, 3)}
            for a in rates:
                tokens = emitted(a, k)
                row[f"ngram_x@{a}"] = round(tokens * dec / ver, 3)
                row[f"dspark_x@{a}"] = None if draft is None else round(tokens * dec / (ver + draft), 3)
            results.append(row)
            save(args, results)
    columns = ["batch", "k", "decode_ms", "verify_ms", "verify_x_decode", "dspark_draft_ms"]
    columns += [f"{s}_x@{a}" for a in rates for s in ("ngram", "dspark")]
    print(table(sorted((r for r in results if not r.get("skipped")), key=lambda r: (r["batch"], r["k"])),
                columns))
    if device.type == "cuda":
        print(f"peak memory {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB")
    return results


# ---- n-gram proposer host cost --------------------------------------------------------------------


def ngram_cost(args: argparse.Namespace) -> list[dict[str, Any]]:
    """CPU microseconds per request and step of the n-gram proposer (as the runner calls it: a History
    view, 1-4 new tokens per step) at --history-token histories; median step, best of 3 runs."""
    import random

    from deepinfer.speculators.interface import History, ProposeBatch, ProposeRequest
    from deepinfer_spec.ngram import NgramProposer

    greedy = SamplingParams(temperature=0)
    results = []
    for batch in ints(args.batches):
        steps = max(20, 2000 // batch)
        best = math.inf
        for run in range(3):
            rng = random.Random(run)
            proposer = NgramProposer(5)
            hist = [[rng.randrange(4096) for _ in range(args.history)] for _ in range(batch)]
            sampled = torch.zeros(batch, dtype=torch.int64)
            times = []
            for step in range(steps + 1):
                tails = [[rng.randrange(4096) for _ in range(rng.randint(1, 4) if step else 0)] for _ in hist]
                t0 = time.thread_time()
                reqs = [ProposeRequest(i, i + 1, len(h) + len(t) - 1, History(h, t), greedy, 0, 5)
                        for i, (h, t) in enumerate(zip(hist, tails, strict=True))]
                proposer.propose(ProposeBatch(reqs, sampled))
                if step:  # the first call indexes the whole history
                    times.append(time.thread_time() - t0)
                for h, t in zip(hist, tails, strict=True):
                    h.extend(t)
            best = min(best, statistics.median(times) / batch * 1e6)
        results.append({"batch": batch, "history": args.history, "us_per_request_step": round(best, 1)})
        save(args, results)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    eng = sub.add_parser("engine", help="end-to-end engine sweep")
    eng.add_argument("--model", type=Path, default=None)
    eng.add_argument("--speculators", default="dspark,ngram")
    eng.add_argument("--ks", default="3,5,1", help="draft lengths, in priority order (budget)")
    eng.add_argument("--schedules", default="fixed,confidence,confidence-sync",
                     help="comma list of fixed, confidence (-sync: that engine without async scheduling)")
    eng.add_argument("--confidence-ks", default="", help="K values for confidence (default: --ks)")
    eng.add_argument("--batches", default="1,8,64")
    eng.add_argument("--max-tokens", type=int, default=64)
    eng.add_argument("--max-model-len", type=int, default=120,
                     help="engine limit (prompts + --max-tokens must fit); up to 128 - 1 - K keeps one "
                     "block-table width of graphs to capture")
    eng.add_argument("--temperature", type=float, default=0.0)
    eng.add_argument("--budget-s", type=float, default=math.inf, help="start no engine after this")
    eng.add_argument("--sync", action="store_true", help="async scheduling off (compare the overlap)")
    cost = sub.add_parser("cost", help="decode / verification / draft step cost per K")
    cost.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    cost.add_argument("--slice-layers", type=int, default=5, help="backbone layers of the Flash slice")
    cost.add_argument("--full-depth", action="store_true",
                      help="the whole Flash config instead (40 layers + 3 DSpark blocks, shared parameters)")
    cost.add_argument("--tiny", action="store_true", help="the tiny full config instead (CPU check)")
    cost.add_argument("--shared-params", action="store_true",
                      help="layers share parameters (implied by --full-depth; with --tiny: a CPU check)")
    cost.add_argument("--engram-vocab", type=int, default=10_000, help="Engram hash vocabulary (Flash: 16M)")
    cost.add_argument("--batches", default="1,8,64")
    cost.add_argument("--ks", default="1,2,3,4,5")
    cost.add_argument("--acceptance", default="0.5,0.7,0.9")
    cost.add_argument("--anchor-length", type=float, default=3.51,
                      help="also model the acceptance of this mean accepted length at --anchor-k (0: off)")
    cost.add_argument("--anchor-k", type=int, default=5)
    cost.add_argument("--reps", type=int, default=5)
    cost.add_argument("--budget-s", type=float, default=math.inf, help="measure no K after this")
    ngram = sub.add_parser("ngram", help="n-gram proposer CPU cost per request and step")
    ngram.add_argument("--history", type=int, default=8192)
    ngram.add_argument("--batches", default="1,64")
    for p in (eng, cost, ngram):
        p.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args()
    # one line per engine / cache: the start-up graph capture's time, split and Triton specialisations
    logging.basicConfig(format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("deepinfer.models.deepseek_v41.graphs").setLevel(logging.INFO)
    torch.manual_seed(0)
    {"engine": engine_sweep, "cost": cost_sweep, "ngram": ngram_cost}[args.mode](args)


if __name__ == "__main__":
    main()
